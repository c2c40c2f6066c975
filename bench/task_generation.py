"""Task generation benchmark: 1000 ``bfcl-gen`` tasks vs BFCL's own eval-based replay.

1. ours — ``BfclGenSuite.generate(1000, seed)``: random initial states, goals, reference calls
   executed for real on fresh backends through the whitelist dispatcher; tasks/s.
2. baseline — BFCL's ``execute_multi_turn_func_call`` (which ``eval``s call strings) replaying
   the ground truth of every ``multi_turn_base`` entry, turn by turn; entries/s. Only the fixed
   benchmark data is given to it, never model output; each repeat uses a fresh model name
   because BFCL caches instances in module globals keyed by it.
3. for reference, our dispatcher replaying the same ground truths (entries/s).

Medians over repeats. The last stdout line is one JSON object; ``ratio`` = ours tasks/s over
the baseline's entries/s (an entry has 2-6 turns and about 4-10 calls; a generated task 1-2
turns and 2-5 calls, so the ratio compares work units, not calls). Target: 1000 tasks < 10 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.record import add_record_flag, record
from envace_engine.environments import get_suite
from envace_engine.environments.bfcl.backends import make_bfcl_env
from envace_engine.environments.bfcl.gen import BfclGenSuite
from envace_engine.types import Task


def time_ours(n: int, seed: int) -> float:
    """Seconds to generate ``n`` bfcl-gen tasks (a fresh suite: no split cache involved)."""
    suite = BfclGenSuite()
    t0 = time.perf_counter()
    tasks = suite.generate(n, seed)
    elapsed = time.perf_counter() - t0
    assert len(tasks) == n
    return elapsed


def time_bfcl_replay(tasks: list[Task]) -> float:
    """Seconds for BFCL's executor to replay every ground-truth turn of ``tasks``."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import (
        execute_multi_turn_func_call,
    )

    model = f"bench_{uuid.uuid4().hex}"
    t0 = time.perf_counter()
    for task in tasks:
        for turn in task.reference_calls:
            execute_multi_turn_func_call(
                [c.raw for c in turn],
                task.initial_state,
                task.meta["involved_classes"],
                model,
                task.meta["entry_id"],
            )
    return time.perf_counter() - t0


def time_our_replay(tasks: list[Task]) -> float:
    """Seconds for our dispatcher to replay the same ground truths on fresh environments."""
    t0 = time.perf_counter()
    for task in tasks:
        env = make_bfcl_env(task)
        for turn, calls in enumerate(task.reference_calls):
            env.start_turn(turn)
            for c in calls:
                env.execute(c)
    return time.perf_counter() - t0


def main() -> None:
    """Run the benchmark and print the JSON summary last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 repeats (under a minute)")
    parser.add_argument("--n", type=int, default=1000, help="bfcl-gen tasks per repeat")
    parser.add_argument("--repeats", type=int, default=7)
    add_record_flag(parser)
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats

    base = get_suite("bfcl").tasks("base")
    ours_s = [time_ours(args.n, seed=100 + r) for r in range(repeats)]
    bfcl_s = [time_bfcl_replay(base) for _ in range(repeats)]
    replay_s = [time_our_replay(base) for _ in range(repeats)]
    for name, values in (("ours", ours_s), ("bfcl_replay", bfcl_s), ("our_replay", replay_s)):
        print(f"{name:12s} " + " ".join(f"{v:.3f}s" for v in values))

    ours_tps = args.n / statistics.median(ours_s)
    bfcl_eps = len(base) / statistics.median(bfcl_s)
    summary = {
        "bench": "task_generation",
        "quick": args.quick,
        "repeats": repeats,
        "tasks": args.n,
        "generate_s_median": round(statistics.median(ours_s), 4),
        "tasks_per_s": round(ours_tps, 1),
        "target_under_10s": statistics.median(ours_s) < 10.0,
        "baseline": "bfcl execute_multi_turn_func_call on multi_turn_base ground truth",
        "baseline_entries": len(base),
        "baseline_s_median": round(statistics.median(bfcl_s), 4),
        "baseline_entries_per_s": round(bfcl_eps, 1),
        "our_replay_entries_per_s": round(len(base) / statistics.median(replay_s), 1),
        "ratio": round(ours_tps / bfcl_eps, 3),
    }
    print(json.dumps(summary))
    if args.record:
        record(__file__, summary)


if __name__ == "__main__":
    main()
