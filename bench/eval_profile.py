"""Where one checkpoint's study evaluation spends its time: phase by phase, with token counts.

Runs one checkpoint's held-out evaluation as ``envace study`` does (``study.evaluation``: the
study config's tasks, repeats, rollout, memory and settings; the sampler ``study.runner``
builds), in this process, but asks the shared imagination (``testtime.rehearsal.Rehearser``)
for each piece before the setting that first needs it, so each piece is timed on its own:

* ``imagine_pool`` — the pool of memory-free imagined episodes (parallel and select read it);
* ``memory_parallel_N`` — the memories parallel N writes over its N pool episodes;
* ``sequential_round_K`` — round K of the sequential chain: imagined episodes with the memory
  so far in context, then the memory update (round 1 is parallel N = 1);
* ``commit_<setting>`` — each setting's committed real episodes (what is left of it once its
  imagination exists), in the order of the study's settings;
* ``world`` — the world evaluation (shadow replay of the first imagined episodes, real NLL).

Per phase: ``wall_s``, the prompt tokens the sampler ran through the model (``prefilled``,
after prefix reuse) and the tokens it sampled (``generated``); ``share`` is each phase's part
of ``total_s``. The evaluation itself is the study's, so ``total_s`` is comparable with a
study's evaluation minutes (model loading excluded; episodes go to a temporary JSON Lines sink
where the study writes Parquet runs). The last line is one JSON object.
``--quick``: the ``tiny`` model, 4 tasks x 1 repeat (the plumbing, not the figures).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.record import add_record_flag, record

if TYPE_CHECKING:
    from envace_engine.samplers.embedded.sampler import HFSampler

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class Meter:
    """Wall time and the embedded sampler's prefill / sample counters around each phase."""

    def __init__(self, sampler: HFSampler) -> None:
        self.sampler = sampler
        self.phases: dict[str, dict[str, float]] = {}

    def __call__(self, name: str, work: Callable[[], Any]) -> Any:
        s = self.sampler
        prefilled, generated, began = s.prefilled, s.generated, time.perf_counter()
        out = work()
        wall = time.perf_counter() - began
        self.phases[name] = {
            "wall_s": round(wall, 2),
            "prefilled": s.prefilled - prefilled,
            "generated": s.generated - generated,
        }
        print(f"{name}: {self.phases[name]}", flush=True)
        return out


def imagination(rehearser: Any, settings: Any, meter: Meter) -> None:
    """Every piece of shared imagination the settings need, each its own phase."""
    from envace_engine.testtime.rehearsal import RehearsalConfig, RehearsalMode

    def quiet(done: int, total: int, message: str) -> None:
        return None

    memory = rehearser.memory
    if any(s.budget > 0 and s.mode is not RehearsalMode.SEQUENTIAL for s in settings):
        meter("imagine_pool", lambda: rehearser.pooled(rehearser.pool_size, quiet))
    for s in settings:
        if s.mode is RehearsalMode.PARALLEL and s.budget > 0:
            config = RehearsalConfig(s.budget, s.mode, memory)
            meter(f"memory_parallel_{s.budget}", partial(rehearser.plans, config))
    rounds = max((s.budget for s in settings if s.mode is RehearsalMode.SEQUENTIAL), default=0)
    for k in range(1, rounds + 1):
        config = RehearsalConfig(k, RehearsalMode.SEQUENTIAL, memory)
        meter(f"sequential_round_{k}", partial(rehearser.plans, config))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Profile one checkpoint's evaluation; the figures."""
    from envace_engine.config import load
    from envace_engine.samplers.embedded.sampler import HFSampler
    from envace_engine.sink import JsonlSink
    from recipes.study.config import StudyConfig
    from recipes.study.evaluation import (
        evaluate_fidelity,
        evaluate_settings,
        make_rehearser,
    )
    from recipes.study.runner import load_policy, make_plan

    sets = [f"model={json.dumps(args.model)}", f"eval.n_tasks={args.n_tasks}"]
    config = load(StudyConfig, args.config, [*sets, f"eval.repeats={args.repeats}"])
    plan = make_plan(config)
    policy = load_policy("bench", config.model, config)
    sampler = policy.sampler
    if not isinstance(sampler, HFSampler):
        raise SystemExit(f"--model {args.model}: the bench profiles the embedded sampler only")
    meter = Meter(sampler)
    rehearser = make_rehearser(policy, plan)
    began = time.perf_counter()
    imagination(rehearser, plan.settings, meter)
    successes: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sink = JsonlSink(tmp)  # the study stores Parquet runs instead
        for setting in plan.settings:
            one = dataclasses.replace(plan, settings=(setting,))

            def keep(result: Any) -> None:
                successes[result.label] = sum(result.success.values()) / len(result.success)

            work = partial(evaluate_settings, policy, one, rehearser, sink, [], keep)
            meter(f"commit_{setting.label}", work)
        meter("world", lambda: evaluate_fidelity(policy, plan, rehearser, sink))
    total = time.perf_counter() - began
    return {
        "model": args.model,
        "quick": args.quick,
        "tasks": len(plan.tasks),
        "repeats": plan.repeats,
        "compute_dtype": sampler.compute_dtype,
        "total_s": round(total, 1),
        "phases": meter.phases,
        "share": {k: round(v["wall_s"] / total, 3) for k, v in meter.phases.items()},
        "prefilled": sum(int(v["prefilled"]) for v in meter.phases.values()),
        "generated": sum(int(v["generated"]) for v in meter.phases.values()),
        "success": {k: round(v, 4) for k, v in successes.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, 4 tasks x 1 repeat")
    parser.add_argument("--config", default="configs/study-toy.toml", help="study config")
    parser.add_argument("--model", default="runs/runs/study-sft/model", help="checkpoint")
    parser.add_argument("--n-tasks", type=int, default=64, help="held-out tasks")
    parser.add_argument("--repeats", type=int, default=2, help="repeats per task")
    add_record_flag(parser)
    args = parser.parse_args()
    if args.quick:
        args.model, args.n_tasks, args.repeats = "tiny", 4, 1
    if not args.quick and not Path(args.model).is_dir():
        raise SystemExit(
            f"--model {args.model}: no such checkpoint; train it with `envace sft --config "
            "configs/study-sft.toml`, pass another checkpoint, or use --quick"
        )
    out = run(args)
    if args.record:
        record(__file__, out)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
