"""Test-time private rehearsal (docs/method.md §5): imagine N episodes, write a memory, commit once.

For every task (and every repeat of it) the agent first rehearses ``budget`` imagined episodes in
which the policy itself answers every tool call (rollout mode ``rehearsal`` with no shadow
environment: nothing imagined ever reaches a real tool), writes a rehearsal memory from them
(``memory``), then runs **one committed episode** against the real tools with that memory in its
context (``memory.with_memory``). ``budget = 0`` is plain execution.

* ``parallel``: the task's ``budget x repeats`` imagined episodes are ONE batched rollout call of
  that task alone, so every prompt in the batch shares the task's prefix and ``HFSampler`` prefills
  it once (prefix reuse; SGLang's radix cache does the same server-side). One memory per repeat is
  written over its N transcripts.
* ``sequential``: imagined episode ``k`` runs with memory ``k-1`` in its context; after it the
  memory is rewritten from memory ``k-1`` plus episode ``k``'s transcript. Each of the N rounds is
  one rollout call batched over all tasks and repeats.
* ``select``: imagined as in ``parallel``, but no memory is written: the committed episode
  starts with the first reply of the imagined episode that looks best (``testtime.select``).
* Imagined rehearse prompts are never grounded in reference results: at test time none exist.

Every imagined episode is returned as an ``Episode`` (mode ``rehearsal``, meta ``imagined_for`` =
the committed episode's id, ``index`` = k) next to its committed episode, whose meta holds the
memory and the token accounting: ``act_tokens`` (committed), ``rehearsal_tokens`` (all tokens the
imagined episodes sampled), ``memory_tokens`` (all memory generations). Layout: docs/rehearsal.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from envace_engine.environments.base import Suite
from envace_engine.rollout.loop import RolloutConfig, rollout
from envace_engine.rollout.memory_prompts import memory_messages, transcript, with_memory
from envace_engine.rollout.prompts import Message
from envace_engine.rollout.tokens import ChatTokenizer
from envace_engine.samplers.base import Sampler, SamplingParams
from envace_engine.seeds import derive_seed
from envace_engine.testtime.memory import (
    MemoryConfig,
    MemoryNote,
    sampled_tokens,
    write_memories,
)
from envace_engine.testtime.select import choose, first_reply, outlook
from envace_engine.types import Episode, MetaKey, Mode, Replay, Role, Task

Progress = Callable[[int, int, str], None]


class RehearsalMode(StrEnum):
    """How imagined episodes relate to each other."""

    PARALLEL = "parallel"
    SEQUENTIAL = "sequential"
    SELECT = "select"


def parse_mode(value: str | RehearsalMode) -> RehearsalMode:
    """A rehearsal mode from its name, with an error that lists the valid ones."""
    try:
        return RehearsalMode(value)
    except ValueError:
        valid = ", ".join(m.value for m in RehearsalMode)
        raise ValueError(f"unknown rehearsal mode {value!r}: use one of {valid}") from None


@dataclass(frozen=True)
class RehearsalConfig:
    """Test-time rehearsal settings: ``budget`` imagined episodes per committed one."""

    budget: int = 0
    mode: RehearsalMode = RehearsalMode.PARALLEL
    memory: MemoryConfig = field(default_factory=MemoryConfig)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", parse_mode(self.mode))
        if self.budget < 0:
            raise ValueError(f"rehearsal budget={self.budget}: use 0 (plain execution) or more")

    @property
    def label(self) -> str:
        """``none`` for plain execution, else the mode (what episode meta records)."""
        return "none" if self.budget == 0 else self.mode.value


@dataclass(frozen=True)
class Plan:
    """One (task, repeat) after private rehearsal, before its committed episode."""

    task: Task
    task_index: int
    repeat: int
    imagined: tuple[Episode, ...] = ()
    memories: tuple[MemoryNote, ...] = ()  # one (parallel) or one per imagined episode
    chosen: int | None = None  # select: the imagined episode whose first reply is replayed

    @property
    def replay(self) -> Replay | None:
        """The first reply the committed episode replays (select mode), else None."""
        return None if self.chosen is None else first_reply(self.imagined[self.chosen])

    @property
    def memory(self) -> str:
        """The memory the committed episode gets: the last one written, skipping failed ones
        (a failed sequential update keeps the earlier memory rather than erasing it)."""
        return next((m.text for m in reversed(self.memories) if m.text), "")


@dataclass(frozen=True)
class Attempt:
    """A committed episode with everything imagined for it (what the sink stores together)."""

    task: Task
    committed: Episode
    imagined: tuple[Episode, ...] = ()

    @property
    def episodes(self) -> tuple[Episode, ...]:
        """The committed episode first, then its imagined ones."""
        return (self.committed, *self.imagined)


def act_tokens(episode: Episode) -> int:
    """Tokens the agent sampled in an episode's act segments."""
    return sum(len(s.token_ids) for s in episode.segments if s.role is Role.ACT)


def _seeded(config: RolloutConfig, phase: int) -> RolloutConfig:
    # A distinct seed per phase, so imagination, memory and commit never reuse one random stream.
    if config.seed is None:
        return config
    return replace(config, seed=derive_seed(config.seed, "rehearsal-phase", phase))


def imagine_config(config: RolloutConfig) -> RolloutConfig:
    """The rollout settings of imagined episodes: policy-rehearsed, no shadow env, not grounded."""
    return replace(config, mode=Mode.REHEARSAL, shadow_real=False, grounded_rehearsal=False)


class Rehearser:
    """Private rehearsal of fixed tasks x repeats at any number of settings, which share their
    imagination (docs/rehearsal.md, *Shared imagination*).

    Every plan (task, repeat) has one **pool** of memory-free imagined episodes, sampled as
    settings need them: ``parallel`` and ``select`` at budget N use its first N episodes, so
    parallel N = 1, parallel N = 2 and select N = 2 imagine two episodes per plan, not five.
    Sequential rehearsal is a chain whose first round is parallel N = 1 (the same prompts: no
    memory before it, one transcript after it) and whose round k continues round k - 1, so
    sequential N = K holds sequential N < K as prefixes. Each setting is still an unbiased
    sample of its procedure; settings that share episodes are paired on them, which makes
    their differences more precise. Memories and chain rounds are kept per budget, so asking
    again for a setting returns the same plans. ``pool_size`` (the largest parallel or select
    budget to come) is imagined in the first call (``pooled``).
    """

    def __init__(
        self,
        tasks: Sequence[Task],
        suite: Suite,
        sampler: Sampler,
        tokenizer: Any,
        config: RolloutConfig,
        memory: MemoryConfig,
        *,
        repeats: int = 1,
        example_pool: Sequence[Task] | None = None,
        run_id: str = "rh",
        pool_size: int = 0,
    ) -> None:
        if repeats < 1:
            raise ValueError(f"repeats={repeats}: use 1 or more committed episodes per task")
        self.tasks, self.repeats, self.pool_size = tuple(tasks), repeats, pool_size
        self.suite, self.sampler, self.tokenizer = suite, sampler, tokenizer
        self.config, self.memory, self.user = imagine_config(config), memory, config.user
        self.example_pool, self.run_id = example_pool, run_id
        self.chat = ChatTokenizer(tokenizer)
        self.base = [Plan(t, i, r) for i, t in enumerate(self.tasks) for r in range(repeats)]
        self._imagined: list[tuple[Episode, ...]] = [() for _ in self.base]
        self._parallel: dict[int, list[Plan]] = {}
        self._chain: list[list[Plan]] = []  # sequential plans after rounds 1, 2, ...

    def plans(self, rehearsal: RehearsalConfig, progress: Progress | None = None) -> list[Plan]:
        """The plans of one setting, computing only what earlier settings have not."""
        if rehearsal.memory != self.memory:
            raise ValueError(
                f"memory settings {rehearsal.memory} differ from this rehearser's {self.memory}: "
                "settings that share imagination share one memory configuration"
            )
        n, report = rehearsal.budget, progress or (lambda done, total, message: None)
        if n == 0 or not self.base:
            return self.base
        if rehearsal.mode is RehearsalMode.SELECT and self.user is not None:
            raise ValueError(
                "select rehearsal replays the agent's first reply, which with a simulated user "
                "follows a sampled user message: use parallel or sequential on this suite"
            )
        if rehearsal.mode is RehearsalMode.SELECT:
            return [replace(p, chosen=choose(p.imagined)) for p in self.pooled(n, report)]
        if rehearsal.mode is RehearsalMode.PARALLEL:
            return self._parallel_plans(n, report)
        return self._sequential(n, report)

    def _rollout(
        self, tasks: Sequence[Task], group_size: int, tag: str, phase: int
    ) -> list[Episode]:
        return rollout(
            tasks,
            self.suite,
            self.sampler,
            self.tokenizer,
            _seeded(self.config, phase),
            group_size,
            example_pool=self.example_pool,
            run_id=f"{self.run_id}-{tag}",
        )

    def _memories(self, prompts: list[list[Message]], phase: int) -> list[MemoryNote]:
        cfg, mem = self.config, self.memory
        params = SamplingParams(
            max_new_tokens=mem.max_new_tokens,
            temperature=cfg.temperature if mem.temperature is None else mem.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            stop_token_ids=(self.chat.eos_id,),
            seed=_seeded(cfg, phase).seed,
        )
        return write_memories(self.sampler, self.chat, prompts, params, cfg.context_limit)

    def pooled(self, n: int, progress: Progress) -> list[Plan]:
        """The base plans with the first ``n`` pool episodes each, imagining what is missing.

        The missing episodes of every task are one group of one batched rollout (consecutive,
        sharing the task's prompt, which the sampler prefills once); all tasks go in the same
        call so the sampler's batch stays full. The first call imagines at least ``pool_size``
        episodes per plan, so the pool is sampled in one call of the same shape whichever
        setting asks first (a resumed evaluation gets the pool an uninterrupted one had).
        """
        have = len(self._imagined[0])
        if have < n:
            more = max(n, self.pool_size) - have
            episodes = self._rollout(self.tasks, more * self.repeats, f"im{have}", 1 + 100 * have)
            size = more * self.repeats
            for k, plan in enumerate(self.base):
                group = episodes[plan.task_index * size : (plan.task_index + 1) * size]
                own = group[plan.repeat * more : (plan.repeat + 1) * more]
                self._imagined[k] = (*self._imagined[k], *own)
            progress(len(self.tasks), len(self.tasks), f"imagined {size} episodes for each task")
        return [replace(p, imagined=e[:n]) for p, e in zip(self.base, self._imagined, strict=True)]

    def _parallel_plans(self, n: int, progress: Progress) -> list[Plan]:
        """The first ``n`` pool episodes, then one memory per plan over all of them."""
        if n not in self._parallel:
            chars = self.memory.transcript_chars
            out = self.pooled(n, progress)
            prompts = [
                memory_messages(p.task, [transcript(e, chars) for e in p.imagined]) for p in out
            ]
            notes = self._memories(prompts, 2 if n == 1 else 2 + 100 * n)
            self._parallel[n] = [
                replace(p, memories=(note,)) for p, note in zip(out, notes, strict=True)
            ]
        return self._parallel[n]

    def _sequential(self, n: int, progress: Progress) -> list[Plan]:
        """Rounds 2.. n, each batched over all plans: imagine with the memory so far, then
        update it; round 1 is parallel N = 1."""
        chars = self.memory.transcript_chars
        if not self._chain:
            first = self._parallel_plans(1, progress)
            self._chain.append([_before(p, "") for p in first])
        while len(self._chain) < n:
            k, plans = len(self._chain), self._chain[-1]
            variants = [with_memory(p.task, p.memory) for p in plans]
            episodes = self._rollout(variants, 1, f"im{k}", 10 + 2 * k)
            episodes = [_marked(e, p.memory) for e, p in zip(episodes, plans, strict=True)]
            prompts = [
                memory_messages(p.task, [transcript(e, chars)], p.memory, first_index=k + 1)
                for p, e in zip(plans, episodes, strict=True)
            ]
            notes = self._memories(prompts, 11 + 2 * k)
            self._chain.append(
                [
                    replace(p, imagined=(*p.imagined, e), memories=(*p.memories, note))
                    for p, e, note in zip(plans, episodes, notes, strict=True)
                ]
            )
            progress(k + 1, n, f"sequential round {k + 1}")
        return self._chain[n - 1]


def _marked(episode: Episode, memory: str) -> Episode:
    """A sequential imagined episode with the memory it had in context."""
    return replace(episode, meta={**episode.meta, MetaKey.MEMORY_BEFORE: memory})


def _before(plan: Plan, memory: str) -> Plan:
    """``plan`` with its imagined episodes marked as run with ``memory`` in context."""
    return replace(plan, imagined=tuple(_marked(e, memory) for e in plan.imagined))


def pool_size(settings: Sequence[tuple[int, RehearsalMode]]) -> int:
    """The pool that (budget, mode) settings read: their largest parallel or select budget."""
    return max((n for n, mode in settings if mode is not RehearsalMode.SEQUENTIAL), default=1)


def rehearse(
    tasks: Sequence[Task],
    suite: Suite,
    sampler: Sampler,
    tokenizer: Any,
    config: RolloutConfig,
    rehearsal: RehearsalConfig,
    *,
    repeats: int = 1,
    example_pool: Sequence[Task] | None = None,
    run_id: str = "rh",
    progress: Progress | None = None,
) -> list[Plan]:
    """Private rehearsal for every task and repeat at one setting (no real environment is ever
    created); ``Rehearser`` shares the imagination of several settings."""
    worker = Rehearser(
        tasks,
        suite,
        sampler,
        tokenizer,
        config,
        rehearsal.memory,
        repeats=repeats,
        example_pool=example_pool,
        run_id=run_id,
    )
    return worker.plans(rehearsal, progress)


def commit(
    plans: Sequence[Plan],
    suite: Suite,
    sampler: Sampler,
    tokenizer: Any,
    config: RolloutConfig,
    rehearsal: RehearsalConfig,
    *,
    example_pool: Sequence[Task] | None = None,
    run_id: str = "rh",
    progress: Progress | None = None,
) -> list[Attempt]:
    """One committed real episode per plan (batched), with its memory in context or, in select
    mode, the chosen imagined episode's first reply replayed; link the imagined ones.

    ``progress(ended, total, message)`` as the real episodes end."""
    if not plans:
        return []
    report = progress or (lambda done, total, message: None)
    real = _seeded(replace(config, mode=Mode.REAL), 3)
    variants = [with_memory(p.task, p.memory) for p in plans]
    episodes = rollout(
        variants,
        suite,
        sampler,
        tokenizer,
        real,
        1,
        example_pool=example_pool,
        run_id=f"{run_id}-c",
        progress=lambda ended, total: report(ended, total, "real episodes ended"),
        first_replies=[p.replay for p in plans],
    )
    return [_attempt(p, e, rehearsal, run_id) for p, e in zip(plans, episodes, strict=True)]


def _attempt(plan: Plan, episode: Episode, rehearsal: RehearsalConfig, run_id: str) -> Attempt:
    """Attach meta (memory, token accounting, links) to a committed episode and its imagined."""
    group = f"{run_id}-{plan.task_index}"  # all repeats of a task form one group (pass^k)
    setting = {MetaKey.BUDGET: rehearsal.budget, MetaKey.REHEARSAL_MODE: rehearsal.label}
    # An imagined episode may serve several settings (``Rehearser``), each stored as its own
    # step of one run, where episode ids must be unique: each setting stores its own copy.
    imagined = tuple(
        replace(
            e,
            id=f"{run_id}-{e.id}",
            group_id=f"{group}-r{plan.repeat}-im",
            meta={
                **e.meta,
                **setting,
                MetaKey.IMAGINED_FOR: episode.id,
                MetaKey.INDEX: k,
                MetaKey.REPEAT: plan.repeat,
            },
        )
        for k, e in enumerate(plan.imagined)
    )
    meta = {
        **episode.meta,
        **setting,
        MetaKey.REPEAT: plan.repeat,
        MetaKey.ACT_TOKENS: act_tokens(episode),
        MetaKey.REHEARSAL_TOKENS: sum(sampled_tokens(e) for e in plan.imagined),
        MetaKey.MEMORY_TOKENS: sum(m.n_tokens for m in plan.memories),
        MetaKey.MEMORY: plan.memory,
        MetaKey.MEMORIES: [m.as_meta() for m in plan.memories],
        MetaKey.IMAGINED_IDS: [e.id for e in imagined],
    }
    if rehearsal.mode is RehearsalMode.SELECT and rehearsal.budget > 0:
        meta[MetaKey.SELECTED] = plan.chosen
        meta[MetaKey.OUTLOOKS] = [outlook(e).as_meta() for e in plan.imagined]
    committed = replace(episode, group_id=group, meta=meta)
    return Attempt(plan.task, committed, imagined)


def run_with_rehearsal(
    tasks: Sequence[Task],
    suite: Suite,
    sampler: Sampler,
    tokenizer: Any,
    config: RolloutConfig,
    rehearsal: RehearsalConfig,
    *,
    repeats: int = 1,
    example_pool: Sequence[Task] | None = None,
    run_id: str = "rh",
    progress: Progress | None = None,
) -> list[Attempt]:
    """Rehearse privately, then commit: one ``Attempt`` per task and repeat, in task order."""
    plans = rehearse(
        tasks,
        suite,
        sampler,
        tokenizer,
        config,
        rehearsal,
        repeats=repeats,
        example_pool=example_pool,
        run_id=run_id,
        progress=progress,
    )
    return commit(
        plans,
        suite,
        sampler,
        tokenizer,
        config,
        rehearsal,
        example_pool=example_pool,
        run_id=run_id,
        progress=progress,
    )
