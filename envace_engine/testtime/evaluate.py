"""Evaluation against the real tools, pass^k, and rehearsal-budget sweeps (N x mode x checkpoint).

* **Success** of one committed episode: its reward (the suite's ``state`` reward by default, i.e.
  BFCL's own multi-turn checker on ``bfcl``) is at least ``success_threshold``. The default 1.0
  means *full* success on every suite; on partial-credit suites (``toy``) the mean reward is
  reported beside it and a lower threshold can be chosen. An unscorable episode (reward None) is a
  failure and is counted in ``unscored``.
* **pass^k** (tau-bench): for a task with ``c`` successes out of ``n`` repeats, the chance that
  ``k`` repeats drawn without replacement all succeed is ``C(c, k) / C(n, k)``; pass^k is its mean
  over tasks. pass^1 is the success rate. It needs ``k <= n``.
* **Sweep**: one evaluation per setting; budget 0 (plain execution) is the same for both modes and
  runs once. Each setting is one sink *step*: its committed and imagined episodes, and metrics
  that name the setting (layout: docs/rehearsal.md, read by the studio's budget page).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from math import comb
from typing import Any

from envace_engine.environments.base import Suite
from envace_engine.rollout.loop import RolloutConfig
from envace_engine.rollout.parsing import INVALID_CALL_CODES
from envace_engine.rollout.rewards import PartsReward
from envace_engine.samplers.base import Sampler
from envace_engine.seeds import derive_seed
from envace_engine.sink import Sink
from envace_engine.testtime.rehearsal import (
    Attempt,
    Progress,
    RehearsalConfig,
    RehearsalMode,
    Rehearser,
    commit,
    parse_mode,
    pool_size,
)
from envace_engine.types import Episode, MetaKey, Task

RewardFn = Callable[[Task, Episode], float | None]


def pass_hat_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """Mean over tasks of ``C(c, k) / C(n, k)`` for ``(c successes, n repeats)`` per task."""
    if k < 1:
        raise ValueError(f"pass^k needs k >= 1, got k={k}")
    if not counts:
        raise ValueError("pass^k of no tasks is undefined: evaluate at least one task")
    total = 0.0
    for c, n in counts:
        if not 0 <= c <= n:
            raise ValueError(f"a task has {c} successes out of {n} repeats: need 0 <= c <= n")
        if k > n:
            raise ValueError(f"pass^{k} needs at least {k} repeats per task; a task has {n}")
        total += comb(c, k) / comb(n, k)
    return total / len(counts)


def is_success(reward: float | None, threshold: float) -> bool:
    """Whether a committed episode's reward counts as a success (None never does)."""
    return reward is not None and reward >= threshold


@dataclass(frozen=True)
class EvalConfig:
    """One evaluation: repeats per task, the rehearsal setting, and what counts as success."""

    repeats: int = 1
    rehearsal: RehearsalConfig = field(default_factory=RehearsalConfig)
    success_threshold: float = 1.0

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats={self.repeats}: use 1 or more episodes per task")
        if not 0.0 < self.success_threshold <= 1.0:
            raise ValueError(
                f"success_threshold={self.success_threshold}: use a reward level in (0, 1]"
            )


@dataclass(frozen=True)
class TaskResult:
    """One task's outcome over its repeats; token counts are means per committed episode."""

    task_id: str
    rewards: tuple[float | None, ...]
    successes: int
    act_tokens: float
    rehearsal_tokens: float
    memory_tokens: float
    real_calls: float
    invalid_calls: float = 0.0  # real calls the tools rejected as invalid (INVALID_* codes)


def invalid_calls(episode: Episode) -> int:
    """Real calls of an episode that the tools rejected as invalid (``INVALID_CALL_CODES``)."""
    errors = (c.real.error for c in episode.calls if c.real is not None)
    return sum(e is not None and e.code in INVALID_CALL_CODES for e in errors)


@dataclass(frozen=True)
class EvalResult:
    """Everything one evaluation produced: per-task results, episodes and wall time."""

    config: EvalConfig
    tasks: tuple[TaskResult, ...]
    attempts: tuple[Attempt, ...]
    wall_s: float

    @property
    def episodes(self) -> list[Episode]:
        """Committed episodes, each followed by its imagined ones (what the sink stores)."""
        return [e for a in self.attempts for e in a.episodes]

    def _is(self, mode: RehearsalMode) -> float:
        """1.0 when the evaluation rehearsed (budget > 0) in ``mode``."""
        rehearsal = self.config.rehearsal
        return float(rehearsal.mode is mode and rehearsal.budget > 0)

    def metrics(self, prefix: str = "eval") -> dict[str, float]:
        """Flat scalar metrics (``{prefix}/success``, ``{prefix}/pass^k``, tokens, wall time)."""
        n = self.config.repeats
        rows = self.tasks
        count = max(len(rows), 1)
        rewards = [r for t in rows for r in t.rewards]
        scored = [r for r in rewards if r is not None]
        out = {
            f"{prefix}/tasks": float(len(rows)),
            f"{prefix}/repeats": float(n),
            f"{prefix}/success": sum(t.successes for t in rows) / max(len(rewards), 1),
            f"{prefix}/reward": sum(scored) / len(scored) if scored else 0.0,
            f"{prefix}/unscored": float(len(rewards) - len(scored)),
            f"{prefix}/budget": float(self.config.rehearsal.budget),
            f"{prefix}/sequential": self._is(RehearsalMode.SEQUENTIAL),
            f"{prefix}/select": self._is(RehearsalMode.SELECT),
            f"{prefix}/wall_s": self.wall_s,
        }
        names = ("act_tokens", "rehearsal_tokens", "memory_tokens", "real_calls", "invalid_calls")
        for name in names:
            out[f"{prefix}/{name}"] = sum(getattr(t, name) for t in rows) / count
        if rows:
            counts = [(t.successes, n) for t in rows]
            out.update({f"{prefix}/pass^{k}": pass_hat_k(counts, k) for k in range(1, n + 1)})
        out.update(part_means([a.committed for a in self.attempts], prefix))
        return out


def part_means(episodes: Sequence[Episode], prefix: str) -> dict[str, float]:
    """``{prefix}/part/<name>``: each named score part's mean over the episodes that have it
    (a part left None, e.g. an unjudged rubric score, is not averaged in)."""
    values: dict[str, list[float]] = {}
    for episode in episodes:
        for name, value in (episode.meta.get(MetaKey.SCORE_PARTS) or {}).items():
            if value is not None:
                values.setdefault(name, []).append(float(value))
    return {f"{prefix}/part/{name}": sum(v) / len(v) for name, v in values.items()}


def score_attempt(attempt: Attempt, reward_fn: RewardFn, threshold: float) -> Attempt:
    """Set the committed episode's reward (and ``meta["success"]``) from the real outcome;
    a ``PartsReward`` also leaves the score's named parts (``meta["score_parts"]``)."""
    committed = attempt.committed
    extra: dict[str, Any] = {}
    if isinstance(reward_fn, PartsReward):
        scored = reward_fn.score(attempt.task, committed)
        reward, extra[MetaKey.SCORE_PARTS] = scored.reward, dict(scored.components)
    else:
        reward = reward_fn(attempt.task, committed)
    meta = {**committed.meta, **extra, MetaKey.SUCCESS: is_success(reward, threshold)}
    return replace(attempt, committed=replace(committed, reward=reward, meta=meta))


def task_results(attempts: Sequence[Attempt], threshold: float) -> tuple[TaskResult, ...]:
    """Group scored attempts by task, in first-seen order."""
    grouped: dict[str, list[Episode]] = {}
    for attempt in attempts:
        grouped.setdefault(attempt.task.id, []).append(attempt.committed)
    results = []
    for task_id, episodes in grouped.items():
        k = len(episodes)

        def mean(key: str, eps: list[Episode] = episodes, k: int = k) -> float:
            return sum(float(e.meta.get(key, 0)) for e in eps) / k

        results.append(
            TaskResult(
                task_id=task_id,
                rewards=tuple(e.reward for e in episodes),
                successes=sum(is_success(e.reward, threshold) for e in episodes),
                act_tokens=mean(MetaKey.ACT_TOKENS),
                rehearsal_tokens=mean(MetaKey.REHEARSAL_TOKENS),
                memory_tokens=mean(MetaKey.MEMORY_TOKENS),
                real_calls=sum(len(e.calls) for e in episodes) / k,
                invalid_calls=sum(invalid_calls(e) for e in episodes) / k,
            )
        )
    return tuple(results)


def evaluate(
    tasks: Sequence[Task],
    suite: Suite,
    sampler: Sampler,
    tokenizer: Any,
    rollout_config: RolloutConfig,
    config: EvalConfig,
    reward_fn: RewardFn,
    *,
    example_pool: Sequence[Task] | None = None,
    run_id: str = "ev",
    progress: Progress | None = None,
    rehearser: Rehearser | None = None,
) -> EvalResult:
    """Evaluate on ``tasks`` in the real environment with the configured rehearsal.

    ``rehearser`` (built for the same tasks and repeats) shares imagination with the other
    settings evaluated through it; without one this setting imagines on its own. Committed
    episodes are sampled with ``rollout_config``'s seed either way."""
    if not tasks:
        raise ValueError("no tasks to evaluate: check the suite, split and --n-tasks")
    start = time.perf_counter()
    if rehearser is None:
        rehearser = Rehearser(
            tasks,
            suite,
            sampler,
            tokenizer,
            rollout_config,
            config.rehearsal.memory,
            repeats=config.repeats,
            example_pool=example_pool,
            run_id=run_id,
        )
    elif rehearser.tasks != tuple(tasks) or rehearser.repeats != config.repeats:
        raise ValueError(
            "the rehearser was built for other tasks or repeats than this evaluation: "
            "build one Rehearser per (tasks, repeats)"
        )
    plans = rehearser.plans(config.rehearsal, progress)
    attempts = commit(
        plans,
        suite,
        sampler,
        tokenizer,
        rollout_config,
        config.rehearsal,
        example_pool=example_pool,
        run_id=run_id,
        progress=progress,
    )
    scored = tuple(score_attempt(a, reward_fn, config.success_threshold) for a in attempts)
    wall = time.perf_counter() - start
    return EvalResult(config, task_results(scored, config.success_threshold), scored, wall)


@dataclass(frozen=True)
class Setting:
    """One sweep point: rehearsal budget and mode (budget 0 is plain execution, mode-free)."""

    budget: int
    mode: RehearsalMode

    @property
    def modes(self) -> tuple[str, ...]:
        """The modes this point stands for (every mode for budget 0)."""
        if self.budget == 0:
            return tuple(m.value for m in RehearsalMode)
        return (self.mode.value,)

    @property
    def label(self) -> str:
        """``plain`` or ``parallel N=2``."""
        return "plain N=0" if self.budget == 0 else f"{self.mode.value} N={self.budget}"


def sweep_settings(budgets: Iterable[int], modes: Iterable[str]) -> list[Setting]:
    """The grid: budget 0 once, then every mode x positive budget (ascending)."""
    wanted = sorted(set(budgets))
    if not wanted or wanted[0] < 0:
        raise ValueError(f"budgets {wanted}: give one or more budgets, each 0 or more")
    kinds = [parse_mode(m) for m in dict.fromkeys(modes)]
    if not kinds:
        valid = ", ".join(m.value for m in RehearsalMode)
        raise ValueError(f"give at least one rehearsal mode: {valid}")
    grid = [Setting(0, kinds[0])] if 0 in wanted else []
    grid += [Setting(n, mode) for mode in kinds for n in wanted if n > 0]
    return grid


@dataclass(frozen=True)
class Checkpoint:
    """A policy to sweep: a display name and its loaded sampler and tokenizer."""

    name: str
    sampler: Sampler
    tokenizer: Any


@dataclass(frozen=True)
class SweepPoint:
    """One evaluated setting of one checkpoint, as written to the sink at ``step``."""

    step: int
    checkpoint: str
    setting: Setting
    metrics: Mapping[str, float]
    tasks: tuple[TaskResult, ...]


def sweep_metrics(result: EvalResult, setting: Setting, checkpoint: int) -> dict[str, float]:
    """A step's metrics: ``sweep/...`` aggregates plus per-setting names for every mode."""
    base = result.metrics("sweep")
    base["sweep/checkpoint"] = float(checkpoint)
    named = {}
    for mode in setting.modes:
        for key in ("success", "reward", "pass^1", "rehearsal_tokens", "memory_tokens"):
            named[f"sweep/{mode}/N={setting.budget}/{key}"] = base[f"sweep/{key}"]
    return {**base, **named}


def commit_config(config: RolloutConfig, label: str) -> RolloutConfig:
    """The rollout settings of one setting's committed episodes: a seed of their own, so two
    settings that share their imagination and memory (parallel and sequential N = 1) still
    commit independent samples."""
    if config.seed is None:
        return config
    return replace(config, seed=derive_seed(config.seed, "commit", label))


def run_sweep(
    tasks: Sequence[Task],
    suite: Suite,
    checkpoints: Iterable[Checkpoint],
    rollout_config: RolloutConfig,
    config: EvalConfig,
    settings: Sequence[Setting],
    reward_fn: RewardFn,
    sink: Sink,
    *,
    n_checkpoints: int = 1,
    example_pool: Sequence[Task] | None = None,
) -> list[SweepPoint]:
    """Evaluate every checkpoint at every setting; one sink step per (checkpoint, setting).
    A checkpoint's settings share their imagination (``Rehearser``).

    ``checkpoints`` may be a lazy iterable (each loaded when its turn comes); ``n_checkpoints``
    is only used for the progress total.
    """
    total = n_checkpoints * len(settings)
    points: list[SweepPoint] = []
    sink.progress(0, total, "starting sweep")
    for c, checkpoint in enumerate(checkpoints):
        rehearser = Rehearser(
            tasks,
            suite,
            checkpoint.sampler,
            checkpoint.tokenizer,
            rollout_config,
            config.rehearsal.memory,
            repeats=config.repeats,
            example_pool=example_pool,
            run_id=f"c{c}",
            pool_size=pool_size([(s.budget, s.mode) for s in settings]),
        )
        for setting in settings:
            step = len(points)
            rehearsal = replace(config.rehearsal, budget=setting.budget, mode=setting.mode)
            here = replace(config, rehearsal=rehearsal)

            def inner(
                done: int, of: int, message: str, step: int = step, name: str = checkpoint.name
            ) -> None:
                sink.progress(step, total, f"{name} {message} ({done}/{of})")

            result = evaluate(
                tasks,
                suite,
                checkpoint.sampler,
                checkpoint.tokenizer,
                commit_config(rollout_config, setting.label),
                here,
                reward_fn,
                example_pool=example_pool,
                run_id=f"s{step}",
                progress=inner,
                rehearser=rehearser,
            )
            metrics = sweep_metrics(result, setting, c)
            sink.episodes(step, result.episodes)
            sink.metrics(step, metrics)
            points.append(SweepPoint(step, checkpoint.name, setting, metrics, result.tasks))
            sink.progress(step + 1, total, f"{checkpoint.name} {setting.label} done")
    return points


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the (cost, success) points no other point beats (cheaper-or-equal and better,
    or strictly cheaper and at least as good), in order of cost."""
    front = []
    for i, (cost, success) in enumerate(points):
        dominated = any(
            (c <= cost and s > success) or (c < cost and s >= success)
            for j, (c, s) in enumerate(points)
            if j != i
        )
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: (points[i][0], -points[i][1]))
