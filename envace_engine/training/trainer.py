"""Role-wise GRPO (docs/method.md §4): rollout -> group -> advantages -> batch -> step -> sink.

Modes (``TrainConfig.mode``):

* ``envace`` — rehearsal rollouts (the policy plays the world); act and rehearse rows trained;
* ``real-grpo`` — the environment-interaction baseline: real rollouts, act rows trained;
* ``act-only`` — rehearsal rollouts with the rehearse role frozen (ablation): act rows trained;
* ``simulator`` — the external-simulator baseline: a frozen copy of the starting model answers
  the tool calls; act rows trained.

One optimizer step per rollout batch, constant lr, grad clip 1.0 by default. Determinism, so
that ``resume`` continues exactly: the task order is a seeded permutation per epoch plus a
position; the sampler's seed derives from (seed, step, rank); checkpoints hold weights,
optimizer, RNG states, step and data position (``checkpoint``). Weight sync: the in-process
``HFSampler`` shares the model object; an SGLang sampler gets each step's weights through
``/update_weights_from_disk``. Distributed: ``distributed`` (each rank rolls out its own groups);
with ``[distributed] strategy = "fsdp"`` the training state is sharded (``fsdp``) and ``model``
is a full copy refreshed after every step.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from envace_engine.config import TrainConfig
from envace_engine.environments import get_suite
from envace_engine.environments.base import Suite
from envace_engine.models import load_model, load_tokenizer, resolve
from envace_engine.rollout.loop import RolloutConfig, rollout
from envace_engine.rollout.rewards import JudgeConfig, make_reward, state_reward
from envace_engine.rollout.tokens import ChatTokenizer, training_rows
from envace_engine.samplers import Sampler, make_sampler
from envace_engine.samplers.base import CacheHolding
from envace_engine.samplers.embedded.heap import release_freed_memory
from envace_engine.seeds import derive_seed
from envace_engine.sink import Sink
from envace_engine.training import checkpoint, world_nll, world_reward
from envace_engine.training.advantages import row_advantages, scorable
from envace_engine.training.lora import trained_model
from envace_engine.training.metrics import role_advantages, step_metrics
from envace_engine.training.optimize import optimize
from envace_engine.training.parallel import distributed, fsdp
from envace_engine.training.parallel.weight_sync import server_sampler, sync_weights
from envace_engine.training.parts import Parts
from envace_engine.training.probe import (
    ProbeMemo,
    run_probe,
    select_probe_tasks,
    start_probe_key,
)
from envace_engine.types import Episode, MetaKey, Mode, Role, Task, TrainRow

if TYPE_CHECKING:
    from transformers import PreTrainedModel

ROLLOUT_MODE = {
    "envace": Mode.REHEARSAL,
    "real-grpo": Mode.REAL,
    "act-only": Mode.REHEARSAL,
    "simulator": Mode.SIMULATOR,
}
log = logging.getLogger(__name__)
TRAINED = {
    "envace": (Role.ACT, Role.REHEARSE),
    "real-grpo": (Role.ACT,),
    "act-only": (Role.ACT,),
    "simulator": (Role.ACT,),
}


def train(
    config: TrainConfig,
    run_dir: Path,
    sink: Sink | None,
    resume: bool = False,
    memo: ProbeMemo | None = None,
) -> int:
    """Build everything for ``config`` and train; return the last completed step."""
    return run(setup(config), run_dir, sink, resume, memo)


def run(
    parts: Parts,
    run_dir: Path,
    sink: Sink | None,
    resume: bool = False,
    memo: ProbeMemo | None = None,
) -> int:
    """Train (or continue, from the newest checkpoint in ``run_dir``) to ``config.steps``.
    ``memo``: where the step-0 probe is looked up and kept (``probe.ProbeMemo``)."""
    config = parts.config
    state = checkpoint.TrainState(0, 0, config.model_dump(mode="json"))
    found = checkpoint.latest(run_dir) if resume else None
    if found is not None:
        state = checkpoint.restore(found, parts.model, parts.optimizer, sharded=parts.sharded)
        parts.refresh_merged()
    # Out-of-process samplers start from whatever their servers loaded: push the weights this
    # run starts from (fresh or restored), so step k always samples from the step-k weights.
    sync_weights(parts.weight_source(), run_dir, state.step)
    if config.world.task_weight < 1 and not world_reward.has_references(parts.tasks):
        log.warning(
            "world.task_weight = %s: suite %s records no reference results, so F scores only "
            "calls the schema check refuses (no F term for the others)",
            config.world.task_weight,
            config.suite,
        )
    for step in range(state.step, config.steps):
        heldout = probe(parts, step, memo=memo)  # before the rollout: after `step` updates
        started = time.perf_counter()
        tasks, position = next_tasks(parts, state.data_position)
        episodes, success = score(parts, tasks, roll(parts, tasks, step))
        rows, world = step_rows(parts, tasks, episodes)
        rows, advantages = scorable(rows, row_advantages(rows, **config.advantages.model_dump()))
        targets = world_targets(parts, tasks, episodes, step)
        rolled = time.perf_counter()
        release_sampler_cache(parts)
        extra = optimize(parts, rows, advantages, targets)
        parts.refresh_merged()
        extra.update(world)
        episodes = with_advantages(episodes, rows, advantages)
        extra.update(timing(episodes, started, rolled))
        extra.update(heldout)
        state = checkpoint.TrainState(step + 1, position, state.config)
        publish(parts, sink, step, episodes, rows, advantages, success, extra)
        if state.step % config.checkpoint_every == 0 or state.step == config.steps:
            save(parts, run_dir, state)
        sync_weights(parts.weight_source(), run_dir, state.step)
        if parts.model.device.type == "cpu":
            release_freed_memory()  # the kept heap fragments over a long run (heap.py)
    final = probe(parts, config.steps, last=True)
    if final and sink is not None and parts.dist.is_main:
        sink.metrics(config.steps, final)  # the trained policy: a metrics-only step
    return state.step


def step_rows(
    parts: Parts, tasks: Sequence[Task], episodes: Sequence[Episode]
) -> tuple[list[TrainRow], dict[str, float]]:
    """The step's training rows of the roles this mode trains, rehearse rows with their own
    rewards when ``world.task_weight < 1``; and the offline fidelity's step metrics (``F`` is
    measured in every mode that rehearses, so arms without the signal can be compared)."""
    config = parts.config
    by_id = {t.id: t for t in tasks}
    terms = {e.id: world_reward.fidelity_terms(by_id[e.task_id], e) for e in episodes}
    weight = config.world.task_weight
    rows = []
    for e in episodes:
        own = None
        if weight < 1:
            own = world_reward.rehearse_rewards(by_id[e.task_id], e, weight, terms[e.id])
        rows += [r for r in training_rows(e, own) if r.role in TRAINED[config.mode]]
    known = [f for fs in terms.values() for f in fs if f is not None]
    n_rehearsals = sum(len(fs) for fs in terms.values())
    metrics = {"world/f_rows": float(len(known))}
    if n_rehearsals:
        metrics["world/f_coverage"] = len(known) / n_rehearsals
    if known:
        metrics["world/f_mean"] = sum(known) / len(known)
    return rows, metrics


def world_targets(
    parts: Parts, tasks: Sequence[Task], episodes: Sequence[Episode], step: int
) -> list[TrainRow]:
    """The known answers the auxiliary world NLL scores this step (none when it is off): the
    step's own rehearsals', then ``loss.world_nll_replay`` replayed SFT rehearse examples; at
    most ``loss.world_nll_rows`` of them (``world_nll.sample_rows``)."""
    config = parts.config
    if config.loss.world_nll == 0:
        return []
    chat = ChatTokenizer(parts.tokenizer)
    rows = world_nll.target_rows({t.id: t for t in tasks}, episodes, chat)
    if config.loss.world_nll_replay:
        seed = derive_seed(config.seed, "world_replay", step, parts.dist.rank)
        rows += world_nll.replay_rows(
            parts.tasks, config.rollout, chat, config.loss.world_nll_replay, seed
        )
    seed = derive_seed(config.seed, "world_nll_rows", step, parts.dist.rank)
    return world_nll.sample_rows(rows, config.loss.world_nll_rows, seed)


def probe(
    parts: Parts, step: int, last: bool = False, memo: ProbeMemo | None = None
) -> dict[str, float]:
    """The held-out probe's metrics when one is due at ``step`` (rank 0 only), else ``{}``.
    At step 0 a ``memo`` holding this probe of these weights answers instead (its time,
    ``perf/probe_s``, was spent by the run that measured it)."""
    every = parts.config.probe.every
    if not every or not parts.dist.is_main or (step % every and not last):
        return {}
    key = start_probe_key(parts.config) if memo is not None and step == 0 else None
    kept = memo.recall(key) if memo is not None and key is not None else None
    if kept is not None:
        return {k: v for k, v in kept.items() if k != "perf/probe_s"}
    out = run_probe(
        parts.config,
        step,
        parts.probe_tasks,
        parts.suite,
        parts.sampler,
        parts.tokenizer,
        parts.model,
        parts.success,
    )
    if memo is not None and key is not None:
        memo.remember(key, out)
    return out


def setup(config: TrainConfig) -> Parts:
    """Load the model, optimizer, sampler, suite, tasks and reward for ``config``."""

    dist = distributed.init()
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    spec = resolve(config.model)
    model, merged = trained_model(spec, config.lora)
    tokenizer = load_tokenizer(spec)
    ref_model: PreTrainedModel | fsdp.LogprobModule | None  # sharded under FSDP
    anchored = config.loss.kl_coef > 0 or config.loss.world_kl > 0
    ref_model = load_model(spec).requires_grad_(False) if anchored else None
    sharded, device = None, distributed.device(dist)
    if dist.enabled and config.distributed.strategy == "fsdp":
        # With SGLang rollouts the full copy is only ever written to disk: keep it off the GPU.
        full_device = torch.device("cpu") if config.sampler else device
        model, sharded, ref_model = fsdp.prepare(model, ref_model, dist, full_device)
    else:
        # (ignore: transformers wraps PreTrainedModel.to in functools.wraps, whose typeshed type
        # does not bind self as a method, so mypy reads the device as the self argument)
        model = model.to(device)
        merged = merged.to(device) if merged is not None else None
        distributed.broadcast_parameters(model.parameters(), dist)
        ref_model = ref_model.to(device) if ref_model is not None else None  # type: ignore[arg-type]
    o = config.optim
    trained = sharded if sharded is not None else model
    optimizer = torch.optim.AdamW(
        [p for p in trained.parameters() if p.requires_grad],
        lr=o.lr,
        betas=o.betas,
        weight_decay=o.weight_decay,
        eps=o.eps,
    )
    r = config.rollout
    embedded: dict[str, Any] = {"batch_size": r.sampler_batch_size, "dtype": r.sampler_dtype}
    if config.sampler:  # rollouts on SGLang servers; weights reach them through the disk
        sampler = server_sampler(config.sampler)
    else:  # in process: the sampler holds the same model object, so it is always current
        sampled = merged if merged is not None else model
        sampler = make_sampler(spec, model=sampled, tokenizer=tokenizer, **embedded)
    simulator = None
    if config.mode == "simulator":  # the frozen starting policy answers the tools
        frozen = load_model(spec).requires_grad_(False)
        simulator = make_sampler(spec, model=frozen, tokenizer=tokenizer, **embedded)
    suite = get_suite(config.suite)
    judge = JudgeConfig(url=config.judge_url) if config.judge_url else None
    return Parts(
        config,
        model,
        ref_model,
        tokenizer,
        optimizer,
        sampler,
        suite,
        select_tasks(suite, config),
        make_reward(config.reward, suite, judge),
        state_reward(suite),
        dist,
        reward_is_success=config.reward == "state",
        sharded=sharded,
        simulator=simulator,
        probe_tasks=_probe_tasks(suite, config),
        merged=merged,
    )


def _probe_tasks(suite: Suite, config: TrainConfig) -> list[Task]:
    if not config.probe.every:
        return []
    return select_probe_tasks(suite, config.probe, config.task_filter)


def select_tasks(suite: Suite, config: TrainConfig) -> list[Task]:
    """The split's tasks whose ``meta`` matches ``task_filter``; an empty result is an error."""
    tasks = [
        t
        for t in suite.tasks(config.split)
        if all(str(t.meta.get(k)) == v for k, v in config.task_filter.items())
    ]
    if not tasks:
        raise ValueError(
            f"no {config.suite}/{config.split} task matches task_filter="
            f"{config.task_filter}: loosen the filter or choose another split"
        )
    return tasks


def next_tasks(parts: Parts, position: int) -> tuple[list[Task], int]:
    """This rank's tasks for one step and the new data position (see ``draw_tasks``)."""
    cfg, d = parts.config, parts.dist
    return draw_tasks(parts.tasks, cfg.seed, position, cfg.tasks_per_step, d.rank, d.world_size)


def draw_tasks(
    tasks: Sequence[Task], seed: int, position: int, per_rank: int, rank: int = 0, world: int = 1
) -> tuple[list[Task], int]:
    """Tasks ``position .. position + per_rank * world`` of the seeded order, this rank's share.

    The order is a fresh seeded permutation per epoch (pass over the tasks), so the data
    position alone says what comes next: a resumed run draws exactly what the lost one would.
    """
    n, count = len(tasks), per_rank * world
    drawn = []
    for p in range(position, position + count):
        order = list(range(n))
        random.Random(derive_seed(seed, "tasks", p // n)).shuffle(order)
        drawn.append(tasks[order[p % n]])
    return drawn[rank::world], position + count


def rollout_config(
    config: TrainConfig, step: int, rank: int, simulator: Sampler | None = None
) -> RolloutConfig:
    """The rollout settings of one step; the sampler seed depends on (seed, step, rank) only.

    ``simulator``: the frozen sampler that answers tool calls in ``simulator`` mode.
    """
    r = config.rollout.episode_settings()
    seed = derive_seed(config.seed, "rollout", step, rank)
    mode = ROLLOUT_MODE[config.mode]
    if mode is Mode.SIMULATOR and simulator is None:
        raise ValueError("mode = 'simulator' needs the frozen simulator sampler (trainer.setup)")
    return RolloutConfig(mode=mode, seed=seed, simulator=simulator, **r)


def roll(parts: Parts, tasks: list[Task], step: int) -> list[Episode]:
    """Roll out every task ``group_size`` times with the current policy."""
    rank = parts.dist.rank
    cfg = rollout_config(parts.config, step, rank, parts.simulator)
    return rollout(
        tasks,
        parts.suite,
        parts.sampler,
        parts.tokenizer,
        cfg,
        parts.config.group_size,
        run_id=f"s{step}r{rank}",
    )


def release_sampler_cache(parts: Parts) -> None:
    """Free the in-process sampler's prefix cache before the optimizer step makes it stale, so
    its K/V is not held beside the step's activations (``CacheHolding``; the frozen simulator's
    stays valid and is kept), and hand the freed pages back on a CPU (``heap.py``)."""
    if isinstance(parts.sampler, CacheHolding):
        parts.sampler.drop_cache()
        if parts.model.device.type == "cpu":
            release_freed_memory()


def score(
    parts: Parts, tasks: Sequence[Task], episodes: list[Episode]
) -> tuple[list[Episode], dict[str, float]]:
    """Set each episode's reward (None = unscorable); real-env success per episode id."""
    by_id = {t.id: t for t in tasks}
    scored, success = [], {}
    for e in episodes:
        task = by_id[e.task_id]
        reward = parts.reward(task, e)
        success[e.id] = reward if parts.reward_is_success else parts.success(task, e)
        scored.append(dataclasses.replace(e, reward=reward))
    return scored, {k: float(v) for k, v in success.items() if v is not None}


def with_advantages(
    episodes: Sequence[Episode], rows: Sequence[TrainRow], advantages: Sequence[float]
) -> list[Episode]:
    """Episodes with ``meta["advantages"] = {"act": mean, "rehearse": mean}`` for the studio."""
    means = role_advantages(rows, advantages)
    return [
        dataclasses.replace(e, meta={**e.meta, MetaKey.ADVANTAGES: means.get(e.id, {})})
        for e in episodes
    ]


def timing(episodes: Sequence[Episode], started: float, rolled: float) -> dict[str, float]:
    """Step time split and sampled tokens per second of the rollout."""
    now = time.perf_counter()
    sampled = sum(int(e.meta.get(MetaKey.SAMPLED_TOKENS, 0)) for e in episodes)
    return {
        "perf/step_s": now - started,
        "perf/rollout_s": rolled - started,
        "perf/train_s": now - rolled,
        "perf/tokens_per_s": sampled / max(rolled - started, 1e-9),
    }


def publish(
    parts: Parts,
    sink: Sink | None,
    step: int,
    episodes: list[Episode],
    rows: list[TrainRow],
    advantages: list[float],
    success: dict[str, float],
    extra: dict[str, float],
) -> None:
    """Gather every rank's step output on rank 0 and hand it to the sink."""
    gathered = distributed.gather((episodes, rows, advantages, success), parts.dist)
    if sink is None or not parts.dist.is_main:
        return
    all_eps = [e for g in gathered for e in g[0]]
    all_rows = [r for g in gathered for r in g[1]]
    all_adv = [a for g in gathered for a in g[2]]
    all_success = {k: v for g in gathered for k, v in g[3].items()}
    sink.episodes(step, all_eps)
    sink.metrics(step, step_metrics(all_eps, all_rows, all_adv, all_success, extra))
    sink.progress(step + 1, parts.config.steps, f"step {step + 1}/{parts.config.steps}")


def save(parts: Parts, run_dir: Path, state: checkpoint.TrainState) -> None:
    """Rank 0 writes the checkpoint; the others wait so nobody runs ahead of it.

    Under FSDP every rank first joins in gathering the sharded optimizer state (a collective)
    into a plain full ``state_dict()``, so the checkpoint has the same format as a DDP one.
    """
    gathered = None
    if parts.sharded is not None:
        gathered = fsdp.full_optimizer_state(parts.optimizer, keep=parts.dist.is_main)
    if parts.dist.is_main:
        checkpoint.save(
            run_dir,
            state,
            parts.model,
            parts.tokenizer,
            parts.optimizer,
            keep=parts.config.keep_checkpoints,
            optimizer_state=gathered,
            prompts=parts.config.rollout,
        )
    distributed.barrier(parts.dist)
