"""Forward tokens of a GRPO step's training micro-batches, an episode's act rows packed or not.

Reads the stored episodes of a finished ``envace train`` run (``--run``, default the study's
``envace`` arm), rebuilds each episode's training rows (``rollout.tokens.training_rows``) with
their stored advantages, keeps the rows a step trains (non-zero advantage), and batches them as
the trainer does (``training.batching.micro_batches`` with the run's ``micro_batch_tokens`` and
``share_prefix``), once with ``pack=True`` and once without. Tokens are counted, nothing is run
on a model: the figure is what packing removes from the forward, not a time (``study_step.py``
times it).

Prints one JSON object as the last line: per step ``rows``, ``act_rows``, ``tokens`` and
``packed_tokens``; the median ``ratio`` (packed / unpacked) over the steps. ``--quick``: the
first 3 steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.record import add_record_flag, record


def _table(run: Path, name: str, step: int) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(run / name / f"step-{step:06d}.parquet").to_pylist()


def step_rows(run: Path, step: int) -> tuple[list, list[float]]:
    """The rows step ``step`` trained (non-zero advantage) and their advantages."""
    from envace_engine.rollout.tokens import training_rows
    from envace_engine.types import Episode, Mode, Rehearsal, Role, Segment

    segments, rehearsals = _table(run, "segments", step), _table(run, "rehearsals", step)
    rows, advantages = [], []
    for e in _table(run, "episodes", step):
        mine = sorted(
            (s for s in segments if s["episode_id"] == e["episode_id"]), key=lambda s: s["seq"]
        )
        segs = tuple(
            Segment(Role(s["role"]), tuple(s["token_ids"]), s["text"], _logprobs(s)) for s in mine
        )
        worlds = tuple(
            Rehearsal(
                r["call_index"],
                tuple(r["prompt_ids"]),
                Segment(Role.REHEARSE, tuple(r["token_ids"]), r["text"], _logprobs(r)),
                r["grounded"],
            )
            for r in rehearsals
            if r["episode_id"] == e["episode_id"]
        )
        episode = Episode(
            e["episode_id"], e["task_id"], e["suite"], Mode(e["mode"]), e["group_id"], segs, worlds
        )
        adv = {Role.ACT: e["adv_act"], Role.REHEARSE: e["adv_rehearse"]}
        for row in training_rows(episode):
            if adv[row.role]:  # None (unscorable) or 0 (no signal): the step skips the row
                rows.append(row)
                advantages.append(float(adv[row.role]))
    return rows, advantages


def _logprobs(record: dict) -> tuple[float, ...] | None:
    return tuple(record["logprobs"]) if record["logprobs"] is not None else None


def forward_tokens(
    rows: list, advantages: list[float], budget: int, share: bool, pack: bool
) -> int:
    """What ``optim/forward_tokens`` counts: every micro-batch's padded tokens and its prefix."""
    from envace_engine.training.batching import micro_batches

    batches = micro_batches(rows, advantages, 0, budget, share, pack)
    return sum(b.input_ids.numel() + b.prefix_ids.numel() for b in batches)


def main() -> None:
    """Count every stored step of the run; print the JSON last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=Path("runs/runs/study-toy--envace-r2"))
    parser.add_argument("--quick", action="store_true", help="the first 3 steps")
    add_record_flag(parser)
    args = parser.parse_args()
    if not (args.run / "run.json").is_file():
        raise SystemExit(f"{args.run} is not a run folder: pass --run with a train run's folder")
    config = json.loads((args.run / "run.json").read_text())["config"]
    budget, share = config["micro_batch_tokens"], config.get("share_prefix", True)
    steps = sorted(
        int(p.stem.split("-")[1]) for p in (args.run / "episodes").glob("step-*.parquet")
    )
    per_step = []
    for step in steps[:3] if args.quick else steps:
        rows, advantages = step_rows(args.run, step)
        if not rows:
            continue
        plain = forward_tokens(rows, advantages, budget, share, pack=False)
        packed = forward_tokens(rows, advantages, budget, share, pack=True)
        acts = sum(r.role == "act" for r in rows)
        per_step.append(
            {
                "step": step,
                "rows": len(rows),
                "act_rows": acts,
                "tokens": plain,
                "packed_tokens": packed,
            }
        )
        print(json.dumps(per_step[-1]), file=sys.stderr)
    ratios = [s["packed_tokens"] / s["tokens"] for s in per_step]
    summary = {
        "run": str(args.run),
        "quick": args.quick,
        "micro_batch_tokens": budget,
        "share_prefix": share,
        "steps": len(per_step),
        "ratio": round(statistics.median(ratios), 3) if ratios else None,
        "per_step": per_step,
    }
    if args.record:
        record(__file__, summary)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
