"""Held-out probes during training: how the policy does on tasks it never trains on, as it trains.

Every ``ProbeSettings.every`` steps (and at step 0) the trainer runs, with the current weights:

* a **real** rollout of the probe tasks (the real tools answer): ``heldout/success``,
  ``heldout/reward``;
* a **rehearsal** rollout of the same tasks, ungrounded (as at test time), with a shadow real
  environment: ``heldout/rehearsed_success`` (task success inside the policy's own rehearsed
  world, scored by replaying its calls for real), the fidelity tiers of every rehearsed-vs-real
  pair (``heldout/fidelity_exact``, ``heldout/status_agree``), and ``heldout/real_nll``: the
  mean negative log-likelihood per token of the *real* response after the rehearse prompt (how
  surprised the world role is by the truth; lower is better);
* ``heldout/gap`` = success − rehearsed_success, the rehearsed-vs-real gap EnvACE aims to close.

The probe never trains and never touches the training task order or RNG streams (its seeds
derive from the run's seed and the step), so a run with probes trains exactly as one without.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from envace_engine.config import ProbeSettings, TrainConfig
from envace_engine.environments.base import Suite
from envace_engine.fidelity.collusion import collusion, collusion_metrics
from envace_engine.fidelity.metrics import compare
from envace_engine.rollout.loop import RolloutConfig, rollout
from envace_engine.rollout.parsing import result_to_json
from envace_engine.rollout.prompts import rehearse_target
from envace_engine.rollout.rewards import RewardFn
from envace_engine.rollout.tokens import ChatTokenizer
from envace_engine.samplers.base import Sampler
from envace_engine.seeds import derive_seed
from envace_engine.training.batching import micro_batches
from envace_engine.training.metrics import fidelity_metrics
from envace_engine.types import Episode, Mode, Role, Task, TrainRow

# Padded tokens per real-NLL forward. Rows are grouped by shared prompt prefix
# (``batching.micro_batches(share_prefix=True)``): the rehearse prompts of one task share the
# instructions, tools and the conversation's start, which then run once per group. Against
# fixed groups of 8 sorted rows, on the study SFT checkpoint's world evaluation of 16 tasks x 2,
# ``bench/eval_profile.py``'s ``world`` phase (nearly all of it this forward) 18.9 -> 14.5 s.
NLL_TOKENS = 4096


class ProbeMemo(Protocol):
    """Step-0 probe results kept for other runs that start from the same weights with the same
    probe (a study's arms), so that probe runs once. Keyed by ``start_probe_key``."""

    def recall(self, key: str) -> dict[str, float] | None:
        """The metrics remembered under ``key``, or None."""
        ...

    def remember(self, key: str, metrics: Mapping[str, float]) -> None:
        """Keep ``metrics`` under ``key``."""
        ...


# What the step-0 probe depends on: it runs before the mode, baseline, loss or optimizer act.
START_PROBE_KEYS = ("model", "sampler", "seed", "suite", "task_filter", "probe", "rollout", "bf16")


def start_probe_key(config: TrainConfig) -> str:
    """A digest of the settings the step-0 probe of a run with ``config`` depends on."""
    body = config.model_dump(mode="json", include=set(START_PROBE_KEYS))
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def select_probe_tasks(
    suite: Suite, settings: ProbeSettings, task_filter: dict[str, str]
) -> list[Task]:
    """The first ``n_tasks`` tasks of the probe split that match the run's ``task_filter``."""
    tasks = [
        t
        for t in suite.tasks(settings.split)
        if all(str(t.meta.get(k)) == v for k, v in task_filter.items())
    ]
    if not tasks:
        raise ValueError(
            f"probe: no {suite.name}/{settings.split} task matches task_filter={task_filter}: "
            "set [probe] split or every = 0"
        )
    return tasks[: settings.n_tasks]


def run_probe(
    config: TrainConfig,
    step: int,
    tasks: Sequence[Task],
    suite: Suite,
    sampler: Sampler,
    tokenizer: Any,
    model: Any,
    success: RewardFn,
) -> dict[str, float]:
    """All ``heldout/*`` metrics of one probe (see the module docstring) and its seconds
    (``perf/probe_s``)."""
    from envace_engine.training.precision import bf16_autocast

    started = time.perf_counter()
    p = config.probe
    r = config.rollout.episode_settings()
    r.update(temperature=p.temperature, grounded_rehearsal=False)
    real_cfg = RolloutConfig(mode=Mode.REAL, seed=derive_seed(config.seed, "probe", step, 0), **r)
    imag_cfg = dataclasses.replace(
        real_cfg, mode=Mode.REHEARSAL, seed=derive_seed(config.seed, "probe", step, 1)
    )
    real = rollout(tasks, suite, sampler, tokenizer, real_cfg, p.repeats, run_id=f"pr{step}")
    bf16 = bf16_autocast(config.bf16, model.device)  # the real NLL as a training step scores
    world = check_world(
        tasks, suite, sampler, tokenizer, model, imag_cfg, p.repeats, success, f"pi{step}", bf16
    )
    by_id = {t.id: t for t in tasks}
    out = {
        "heldout/success": _mean(list(per_task_success(real, by_id, success).values())),
        "heldout/reward": _mean([success(by_id[e.task_id], e) for e in real]),
        **{f"heldout/{k}": v for k, v in world.metrics.items()},
    }
    out["heldout/gap"] = out["heldout/success"] - out["heldout/rehearsed_success"]
    out["perf/probe_s"] = time.perf_counter() - started
    return out


@dataclass(frozen=True)
class WorldCheck:
    """The policy inside its own rehearsed world: episodes, per-task success, pair fidelity."""

    episodes: list[Episode]
    per_task: dict[str, float]  # task id -> full successes / repeats
    metrics: dict[str, float]  # rehearsed_success, pairs, fidelity_exact, ..., real_nll
    exact_by_task: dict[str, float]  # task id -> share of its pairs that are exact
    # task id -> exact, status_agree, score and the collusion rates it can count (``by_task``)
    by_task: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)


def check_world(
    tasks: Sequence[Task],
    suite: Suite,
    sampler: Sampler,
    tokenizer: Any,
    model: Any | None,
    config: RolloutConfig,
    repeats: int,
    success: RewardFn,
    run_id: str,
    bf16: bool = False,
) -> WorldCheck:
    """A rehearsal rollout of ``tasks`` (``config``: rehearsal mode, ungrounded, with a shadow
    real environment) and everything it says about the world model. ``model`` (the policy's
    transformers model) scores the real responses' NLL (``bf16``: see ``real_nll``); None skips
    it (a served model)."""
    if config.mode is not Mode.REHEARSAL or config.grounded_rehearsal or not config.shadow_real:
        raise ValueError("check_world needs an ungrounded rehearsal rollout with a shadow env")
    episodes = rollout(tasks, suite, sampler, tokenizer, config, repeats, run_id=run_id)
    return judge_world(tasks, episodes, tokenizer, model, success, bf16)


def judge_world(
    tasks: Sequence[Task],
    episodes: list[Episode],
    tokenizer: Any,
    model: Any | None,
    success: RewardFn,
    bf16: bool = False,
) -> WorldCheck:
    """What ungrounded rehearsal episodes of ``tasks`` whose calls carry real answers (a shadow
    environment's, or ``rollout.shadow.replay_shadow``'s) say about the world model
    (``bf16``: see ``real_nll``)."""
    per_task = per_task_success(episodes, {t.id: t for t in tasks}, success)
    metrics = {"rehearsed_success": _mean(list(per_task.values())), **pair_metrics(episodes)}
    if model is not None:
        nll = real_nll(model, ChatTokenizer(tokenizer), episodes, bf16)
        if nll is not None:
            metrics["real_nll"] = nll
    return WorldCheck(episodes, per_task, metrics, exact_by_task(episodes), by_task(episodes))


def exact_by_task(episodes: Sequence[Episode]) -> dict[str, float]:
    """Per task, the share of its rehearsed-vs-real pairs that match exactly (tasks with
    pairs only)."""
    hits: dict[str, list[bool]] = {}
    for e in episodes:
        for c in e.calls:
            if c.shown == "rehearsed" and c.real is not None:
                hits.setdefault(e.task_id, []).append(compare(c.rehearsed, c.real).exact)
    return {task: sum(v) / len(v) for task, v in hits.items()}


def by_task(episodes: Sequence[Episode]) -> dict[str, dict[str, float]]:
    """Per task with rehearsed-vs-real pairs: the share exact, the share whose status agrees,
    the mean pair score, and the collusion rates its episodes can count (``fidelity.collusion``):
    what a study pairs by task to put a confidence interval on a world-model difference."""
    grouped: dict[str, list[Episode]] = {}
    for e in episodes:
        grouped.setdefault(e.task_id, []).append(e)
    out = {}
    for task, eps in grouped.items():
        pairs = [
            compare(c.rehearsed, c.real)
            for e in eps
            for c in e.calls
            if c.shown == "rehearsed" and c.real is not None
        ]
        if not pairs:
            continue
        n = len(pairs)
        row = {
            "exact": sum(p.exact for p in pairs) / n,
            "status_agree": sum(p.status_agree for p in pairs) / n,
            "score": sum(p.score for p in pairs) / n,
        }
        out[task] = {**row, **collusion(eps).rates()}
    return out


def _mean(values: Sequence[float | None]) -> float:
    scored = [v for v in values if v is not None]
    return sum(scored) / len(scored) if scored else 0.0


def per_task_success(
    episodes: Sequence[Episode], by_id: dict[str, Task], success: RewardFn
) -> dict[str, float]:
    """Per task, the share of its episodes whose replayed calls fully succeed (reward 1)."""
    hits: dict[str, list[float]] = {}
    for e in episodes:
        value = success(by_id[e.task_id], e)
        hits.setdefault(e.task_id, []).append(1.0 if value is not None and value >= 1.0 else 0.0)
    return {task: sum(v) / len(v) for task, v in hits.items()}


def pair_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Fidelity tiers over the rehearsed-vs-real pairs (``metrics.fidelity_metrics``, which
    counts an unparseable rehearsal as a pair that failed every tier), as probe names, and the
    collusion rates (``fidelity.collusion``)."""
    tiers = fidelity_metrics(episodes)
    names = {
        "fidelity/pairs": "pairs",
        "fidelity/exact": "fidelity_exact",
        "fidelity/status_agree": "status_agree",
        "fidelity/score": "fidelity_score",
    }
    out = {new: tiers[old] for old, new in names.items() if old in tiers}
    out.update(collusion_metrics(episodes, prefix=""))  # echo_rate, error_recall, ...
    return out


def real_nll(
    model: Any, chat: ChatTokenizer, episodes: Sequence[Episode], bf16: bool = False
) -> float | None:
    """Mean NLL per token of each rehearsal's *real* result (as the world role's target text:
    ``<execution_result>…</execution_result>`` + end of turn) after its rehearse prompt.

    ``bf16``: the forward under bf16 autocast, as a bf16 training step runs it (the log-softmax
    stays fp32, ``logprobs.ChunkedHeadLogProb``); callers pass ``precision.bf16_autocast``'s
    answer, so it is asked for only where bf16 GEMMs are native."""
    import torch

    from envace_engine.logprobs import completion_logprobs

    rows = []
    for episode in episodes:
        for rehearsal in episode.rehearsals:
            real = episode.calls[rehearsal.call_index].real
            if real is None:
                continue
            target = (*chat.encode(rehearse_target(result_to_json(real))), chat.eos_id)
            rows.append(
                TrainRow(
                    "probe",
                    "probe",
                    Role.REHEARSE,
                    rehearsal.prompt_ids,
                    target,
                    (0.0,) * len(target),
                    None,
                )
            )
    if not rows:
        return None
    total, count = 0.0, 0
    for batch in micro_batches(rows, [0.0] * len(rows), chat.eos_id, NLL_TOKENS, share_prefix=True):
        with (
            torch.inference_mode(),
            torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=bf16),
        ):
            lp = completion_logprobs(
                model,
                batch.input_ids,
                batch.attention_mask,
                batch.completion_mask,
                prefix_ids=batch.prefix_ids,
            )
        mask = batch.completion_mask.bool()
        total += float(-lp[mask].sum())
        count += int(mask.sum())
    return total / max(count, 1)
