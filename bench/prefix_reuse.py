"""Marginal cost of an extra imagined episode, with and without prefix reuse (smollm2-135m, toy).

Parallel rehearsal runs a task's N imagined episodes as ONE batched rollout, so their prompts
share the task's prefix (system message with tools and worked examples, the request). With
``HFSampler(prefix_reuse=True)`` that prefix is prefilled once per batch and its KV cache is
repeated to every row; without it every row prefills the whole prompt.

Measured in one run, on the same toy task, rollout mode ``rehearsal`` (imagined: no real env):

* ``first_s``   — one imagined episode alone;
* ``batch_s``   — 1 + N imagined episodes in one rollout, prefix reuse on / off;
* marginal cost per extra episode = (batch_s - first_s) / N;
* ``ratio`` = marginal cost with reuse / first_s (target <= 0.5); ``ratio_no_reuse`` the same
  without reuse (the baseline, measured in the same run). Wall-clock figures, plus the same
  from this process's CPU time (``cpu_*``), which a CPU shared with other jobs distorts less
  (run with ``OMP_NUM_THREADS=1`` there: idle OpenMP threads spin and count as CPU time).

Decoding is greedy so every condition samples exactly the same tokens (the episodes of a batch
are then identical, so their later prompts share more than sampled episodes would; the full run
adds a sampled measurement, ``ratio_sampled``, at temperature 1.0 with medians over seeds).
Prints one JSON object as the last line; times are medians over ``--reps``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.record import add_record_flag, record

if TYPE_CHECKING:
    from envace_engine.rollout.loop import RolloutConfig

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _setup(quick: bool) -> dict:
    from envace_engine.environments import get_suite
    from envace_engine.models import load_model, load_tokenizer, resolve
    from envace_engine.rollout.loop import RolloutConfig
    from envace_engine.samplers.embedded.sampler import HFSampler
    from envace_engine.testtime.rehearsal import imagine_config

    spec = resolve("smollm2-135m")
    tokenizer = load_tokenizer(spec)
    model = load_model(spec)
    suite = get_suite("toy")
    caps = 40 if quick else 48
    config = imagine_config(
        RolloutConfig(
            temperature=0.0,
            seed=0,
            max_turns=1 if quick else 2,
            max_new_tokens_act=caps,
            max_new_tokens_rehearse=caps,
            n_examples=2,
            check_drift=False,
        )
    )
    return {
        "suite": suite,
        "task": suite.tasks("validation")[0],
        "pool": suite.tasks("train"),
        "tokenizer": tokenizer,
        "config": config,
        "reuse": HFSampler(model, tokenizer, prefix_reuse=True),
        "plain": HFSampler(model, tokenizer, prefix_reuse=False),
    }


def _time(
    env: dict, sampler_key: str, episodes: int, config: RolloutConfig
) -> tuple[float, float, int]:
    """Wall and CPU seconds of one rollout of ``episodes`` imagined episodes; tokens sampled."""
    from envace_engine.rollout.loop import rollout

    wall, cpu = time.perf_counter(), time.process_time()
    out = rollout(
        [env["task"]],
        env["suite"],
        env[sampler_key],
        env["tokenizer"],
        config,
        episodes,
        example_pool=env["pool"],
        run_id="bench",
    )
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return wall, cpu, sum(e.meta["sampled_tokens"] for e in out)


def _warm_up(env: dict) -> None:
    """First-call allocations and lazy imports, outside the timings (a few tokens only)."""
    from envace_engine.samplers.base import SamplingParams

    ids = env["tokenizer"]("warm up", add_special_tokens=False)["input_ids"]
    for key in ("reuse", "plain"):
        env[key].generate([ids, ids], SamplingParams(max_new_tokens=2, temperature=0.0))


def _column(runs: dict[str, list[tuple[float, float, int]]], key: str, i: int) -> list[float]:
    """One clock's seconds (0: wall, 1: CPU) of one condition's reps."""
    return [float(t[i]) for t in runs[key]]


def _ratios(first: list[float], reuse: list[float], plain: list[float], *, extra: int) -> dict:
    """Medians and marginal-cost ratios of one clock (wall or CPU)."""
    f, r, p = statistics.median(first), statistics.median(reuse), statistics.median(plain)
    return {
        "first_s": round(f, 3),
        "batch_reuse_s": round(r, 3),
        "batch_no_reuse_s": round(p, 3),
        "marginal_reuse_s": round((r - f) / extra, 3),
        "marginal_no_reuse_s": round((p - f) / extra, 3),
        "ratio": round((r - f) / extra / f, 3),
        "ratio_no_reuse": round((p - f) / extra / f, 3),
    }


def _measure(
    env: dict, extra: int, reps: int, config: RolloutConfig, sampled: bool = False
) -> dict:
    from dataclasses import replace

    runs: dict[str, list[tuple[float, float, int]]] = {"first": [], "reuse": [], "plain": []}
    for rep in range(reps):
        if sampled:  # a new seed per rep; the three conditions of a rep share it
            config = replace(config, temperature=1.0, seed=rep)
        runs["first"].append(_time(env, "reuse", 1, config))  # batch of one: nothing to share
        runs["reuse"].append(_time(env, "reuse", 1 + extra, config))
        runs["plain"].append(_time(env, "plain", 1 + extra, config))
    wall = _ratios(*(_column(runs, k, 0) for k in ("first", "reuse", "plain")), extra=extra)
    cpu = _ratios(*(_column(runs, k, 1) for k in ("first", "reuse", "plain")), extra=extra)
    tokens = int(statistics.median(t[2] for t in runs["first"]))
    return {**wall, **{f"cpu_{k}": v for k, v in cpu.items()}, "tokens_first_episode": tokens}


def main() -> None:
    """Run the benchmark and print its JSON summary as the last line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small caps, one rep (< 1 min)")
    parser.add_argument("--extra", type=int, default=None, help="extra imagined episodes N")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (median)")
    add_record_flag(parser)
    args = parser.parse_args()
    extra = args.extra or (3 if args.quick else 4)
    reps = args.reps or (1 if args.quick else 3)
    env = _setup(args.quick)
    _warm_up(env)
    result = {
        "bench": "prefix_reuse",
        "model": "smollm2-135m",
        "task": env["task"].id,
        "extra_episodes": extra,
        "reps": reps,
        "quick": args.quick,
        "target": 0.5,
    }
    result.update(_measure(env, extra, reps, env["config"]))
    if not args.quick:
        sampled = _measure(env, extra, reps, env["config"], sampled=True)
        result["ratio_sampled"] = sampled["ratio"]
        result["ratio_sampled_no_reuse"] = sampled["ratio_no_reuse"]
    print(json.dumps(result))
    if args.record:
        record(__file__, result)


if __name__ == "__main__":
    main()
