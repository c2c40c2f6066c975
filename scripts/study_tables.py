"""Two tables of docs/study.md that the study report does not print, from a study's stored data.

    python scripts/study_tables.py --study runs/runs/study-toy

* **training**: per arm, from ``study.json``'s curves: mean reward of the first and last five
  steps, the median share of rows with a non-zero advantage per role, steps with none, the
  held-out probe at its first and last step, the median seconds per step, and the
  sampler/trainer mismatch;
* **calls**: per evaluated checkpoint, the real calls of its plain (N = 0) setting that the
  tools rejected as invalid (``INVALID_CALL_CODES``, by tool), and in its world evaluation how
  many calls the real tools and the rehearsals answered with an error — read from the
  evaluation runs' ``calls`` shards beside the study folder.

Prints both as text and, last, one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import duckdb

from envace_engine.rollout.parsing import INVALID_CALL_CODES

PROBE = ("success", "fidelity_exact", "real_nll")  # the held-out probe figures in the table


def training(curves: dict[str, dict[str, dict[str, float]]]) -> dict[str, Any]:
    """The training table of each arm's curve (steps as strings, as study.json keeps them)."""
    out = {}
    for arm, curve in curves.items():
        rows = [curve[s] for s in sorted(curve, key=int)]
        trained = [r for r in rows if "reward/mean" in r]
        probes = [r for r in rows if "heldout/success" in r]

        def median(key: str, of: list[dict[str, float]] = trained) -> float | None:
            values = [r[key] for r in of if key in r]
            return statistics.median(values) if values else None

        reward = [r["reward/mean"] for r in trained]
        silent = [
            r for r in trained if not r.get("adv/act/nonzero") and not r.get("adv/rehearse/nonzero")
        ]
        out[arm] = {
            "reward_first5": statistics.mean(reward[:5]),
            "reward_last5": statistics.mean(reward[-5:]),
            "nonzero_act": median("adv/act/nonzero"),
            "nonzero_rehearse": median("adv/rehearse/nonzero"),
            "steps_without_signal": len(silent),
            "probe_first": {k: probes[0].get(f"heldout/{k}") for k in PROBE},
            "probe_last": {k: probes[-1].get(f"heldout/{k}") for k in PROBE},
            "median_step_s": median("perf/step_s"),
            "median_logprob_diff": median("rollout/logprob_diff"),
            "max_logprob_diff": max(r.get("rollout/logprob_diff", 0.0) for r in trained),
            "max_mismatch_kl": max(r.get("rollout/mismatch_kl", 0.0) for r in trained),
        }
    return out


def calls(runs: Path, evals: dict[str, Any]) -> dict[str, Any]:
    """Rejected real calls at N = 0 and errors in the world evaluation, per checkpoint."""
    out = {}
    for name, record in evals.items():
        plain = runs / record["run_id"] / "calls" / "step-000000.parquet"  # the N = 0 setting
        if not plain.is_file():
            continue
        rows = duckdb.execute(
            f"SELECT tool, real_error FROM read_parquet('{plain}') WHERE real_error IS NOT NULL "
            "OR real_json IS NOT NULL"
        ).fetchall()
        invalid = [tool for tool, code in rows if code in INVALID_CALL_CODES]
        entry: dict[str, Any] = {
            "real_calls": len(rows),
            "invalid": len(invalid),
            "invalid_by_tool": {t: invalid.count(t) for t in sorted(set(invalid))},
        }
        world = runs / record.get("fidelity_run_id", "") / "calls"
        if record.get("fidelity_run_id") and world.is_dir():
            pairs, real, rehearsed = duckdb.execute(
                "SELECT count(*), count(*) FILTER (real_status = 'error'), "
                "count(*) FILTER (rehearsed_status = 'error') "
                f"FROM read_parquet('{world}/*.parquet')"
            ).fetchall()[0]
            entry.update(
                world_calls=pairs, world_real_errors=real, world_rehearsed_errors=rehearsed
            )
        out[name] = entry
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", type=Path, required=True, help="the study's run folder")
    args = parser.parse_args()
    state = json.loads((args.study / "study.json").read_text(encoding="utf-8"))
    result = {
        "training": training(state["curves"]),
        "calls": calls(args.study.parent, state["evals"]),
    }
    for arm, t in result["training"].items():
        print(f"{arm}: {json.dumps(t)}")
    for name, c in result["calls"].items():
        print(f"{name}: {json.dumps(c)}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
