"""Held-out evaluation of one checkpoint, as the study defines it (docs/study.md).

For each test-time setting (budget N × mode; N = 0 once) the checkpoint runs ``repeats``
committed real-environment episodes per held-out task after its private rehearsal
(``testtime.evaluate``); every setting is one step of the checkpoint's ``sweep`` run. The
settings share their imagined episodes (``make_rehearser``). Then the world model, from the
first imagined episode of every task and repeat — ungrounded rehearsal, as at test time — with
the answers a shadow real environment would have given (``rollout.shadow.replay_shadow``):
fidelity of every rehearsed-vs-real pair, the real responses' NLL under the policy, and task
success inside the rehearsed world (``training.probe.judge_world``) — a step of the
checkpoint's ``eval`` run. Each finished unit is returned to the caller at once
(``on_setting``, ``on_fidelity``), so a killed study keeps what was evaluated.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from envace_engine.environments.base import Suite
from envace_engine.fidelity.collusion import COLLUSION_RATES
from envace_engine.rollout.loop import RolloutConfig
from envace_engine.rollout.rewards import RewardFn
from envace_engine.rollout.shadow import replay_shadow
from envace_engine.seeds import derive_seed
from envace_engine.sink import Sink
from envace_engine.testtime.evaluate import (
    EvalConfig,
    EvalResult,
    Setting,
    evaluate,
    sweep_metrics,
    sweep_settings,
)
from envace_engine.testtime.memory import MemoryConfig
from envace_engine.testtime.rehearsal import (
    Progress,
    RehearsalConfig,
    RehearsalMode,
    Rehearser,
    pool_size,
)
from envace_engine.training.probe import WorldCheck, check_world, judge_world
from envace_engine.types import Mode, Task
from recipes.study.state import FidelityResult, SettingResult


@dataclass(frozen=True)
class Policy:
    """A loaded checkpoint: its sampler and tokenizer, and its transformers model (None when
    it is served, e.g. by SGLang: then the real-response NLL is not computed)."""

    name: str
    sampler: Any
    tokenizer: Any
    model: Any | None
    bf16: bool = False  # the real NLL under bf16 autocast (``training.probe.real_nll``)


@dataclass(frozen=True)
class EvalPlan:
    """What to evaluate: held-out tasks, the example pool, settings, rollout and repeats."""

    suite: Suite
    tasks: tuple[Task, ...]
    pool: tuple[Task, ...]
    settings: tuple[Setting, ...]
    rollout: RolloutConfig
    repeats: int
    memory_tokens: int
    success: RewardFn
    seed: int


def plan_settings(
    budgets: Sequence[int], modes: Sequence[str], select_budgets: Sequence[int] = ()
) -> tuple[Setting, ...]:
    """The setting grid: N = 0 once, then every mode × positive budget, then ``select`` at each
    of ``select_budgets`` (last, so a study that adds them on resume keeps its step numbers)."""
    grid = sweep_settings(budgets, modes)
    return (*grid, *(Setting(n, RehearsalMode.SELECT) for n in sorted(set(select_budgets))))


def result_of(setting: Setting, result: EvalResult) -> SettingResult:
    """A setting's per-task success rates and mean costs, as the study state keeps them."""
    m = result.metrics("eval")
    n = result.config.repeats
    return SettingResult(
        label=setting.label,
        budget=setting.budget,
        mode="none" if setting.budget == 0 else setting.mode.value,
        success={t.task_id: t.successes / n for t in result.tasks},
        reward=m["eval/reward"],
        real_calls=m["eval/real_calls"],
        act_tokens=m["eval/act_tokens"],
        rehearsal_tokens=m["eval/rehearsal_tokens"],
        memory_tokens=m["eval/memory_tokens"],
        wall_s=result.wall_s,
        invalid_calls=m["eval/invalid_calls"],
    )


def make_rehearser(policy: Policy, plan: EvalPlan) -> Rehearser:
    """The imagination one checkpoint's settings and its world evaluation share, sampled with
    one seed of the evaluation (``Rehearser``)."""
    return Rehearser(
        plan.tasks,
        plan.suite,
        policy.sampler,
        policy.tokenizer,
        dataclasses.replace(plan.rollout, seed=derive_seed(plan.seed, "study-eval", "rehearsal")),
        MemoryConfig(plan.memory_tokens),
        repeats=plan.repeats,
        example_pool=plan.pool,
        run_id="im",
        pool_size=pool_size([(s.budget, s.mode) for s in plan.settings]),
    )


def evaluate_settings(
    policy: Policy,
    plan: EvalPlan,
    rehearser: Rehearser,
    sink: Sink,
    done: Sequence[str],
    on_setting: Callable[[SettingResult], None],
) -> None:
    """Every setting of ``plan`` not in ``done`` (labels), one sink step each (step = index).

    The settings share their imagination (``testtime.rehearsal.Rehearser``: one pool of
    imagined episodes per task and repeat, one sequential chain), sampled with one seed of the
    evaluation; each setting commits with a seed of its own. A setting's ``wall_s`` is the time
    it took here, including the shared imagination it was the first to need; its token counts
    are what the setting costs on its own at test time.
    """
    memory = rehearser.memory
    for index, setting in enumerate(plan.settings):
        if setting.label in done:
            continue
        config = EvalConfig(plan.repeats, RehearsalConfig(setting.budget, setting.mode, memory))
        seeded = dataclasses.replace(
            plan.rollout, seed=derive_seed(plan.seed, "study-eval", setting.label)
        )

        def progress(a: int, b: int, message: str, index: int = index) -> None:
            sink.progress(index, len(plan.settings), f"{policy.name} {message} ({a}/{b})")

        result = evaluate(
            plan.tasks,
            plan.suite,
            policy.sampler,
            policy.tokenizer,
            seeded,
            config,
            plan.success,
            example_pool=plan.pool,
            run_id=f"s{index}",
            progress=progress,
            rehearser=rehearser,
        )
        sink.episodes(index, result.episodes)
        sink.metrics(index, sweep_metrics(result, setting, 0))
        sink.progress(index + 1, len(plan.settings), f"{policy.name} {setting.label} done")
        on_setting(result_of(setting, result))


def evaluate_fidelity(
    policy: Policy, plan: EvalPlan, rehearser: Rehearser, sink: Sink
) -> FidelityResult:
    """The checkpoint inside its own rehearsed world (see the module docstring)."""
    started = time.perf_counter()
    sink.progress(0, 1, f"{policy.name}: the world of {len(plan.tasks)} tasks")
    world = _world(policy, plan, rehearser, lambda a, b, message: None)
    sink.episodes(0, world.episodes)
    sink.metrics(0, {f"fidelity_eval/{k}": v for k, v in world.metrics.items()})
    sink.progress(1, 1, f"{policy.name}: fidelity done")
    m = world.metrics
    return FidelityResult(
        rehearsed_success=world.per_task,
        pairs=int(m.get("pairs", 0)),
        exact=m.get("fidelity_exact"),
        status_agree=m.get("status_agree"),
        score=m.get("fidelity_score"),
        real_nll=m.get("real_nll"),
        wall_s=time.perf_counter() - started,
        exact_by_task=world.exact_by_task,
        collusion={k: m[k] for k in COLLUSION_RATES if k in m},
        by_task=world.by_task,
    )


def _world(policy: Policy, plan: EvalPlan, rehearser: Rehearser, progress: Progress) -> WorldCheck:
    """The first imagined episode of every task and repeat (the one parallel N = 1 wrote its
    memory from), with the answers a shadow environment would have given
    (``rollout.shadow.replay_shadow``); with a simulated user, whose own tool calls change the
    environment, a separate rehearsal rollout with a live shadow environment instead."""
    if plan.rollout.user is None:
        episodes = [
            replay_shadow(p.imagined[0], p.task, plan.suite) for p in rehearser.pooled(1, progress)
        ]
        return judge_world(
            plan.tasks, episodes, policy.tokenizer, policy.model, plan.success, policy.bf16
        )
    config = dataclasses.replace(
        plan.rollout,
        mode=Mode.REHEARSAL,
        grounded_rehearsal=False,
        shadow_real=True,
        seed=derive_seed(plan.seed, "study-fidelity"),
    )
    return check_world(
        plan.tasks,
        plan.suite,
        policy.sampler,
        policy.tokenizer,
        policy.model,
        config,
        plan.repeats,
        plan.success,
        "fid",
        policy.bf16,
    )
