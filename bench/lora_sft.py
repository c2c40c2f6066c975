"""The SFT recipe as LoRA against full fine-tuning: one unit of a pre-registered grid per call.

Recipe: configs/study-core-sft.toml (same data, steps, schedule and seed in every unit); only
``lora.*`` and ``lr`` change. Each call runs one unit in a child process and prints one JSON
object: wall seconds, the child's peak RSS, the saved model's size on disk, and the recipe's
teacher-forced held-out metrics (``sft/heldout/*``: exact tool calls and exact rehearsals on
64 validation tasks). Units run one at a time on an otherwise idle machine.

Pre-registered grid (written before any unit ran; the rule picks, not the results):

* ``full``        every weight, the recipe's lr 3e-4 (the reference);
* ``r16-lr3e-4``, ``r16-lr1e-3``, ``r64-lr3e-4``, ``r64-lr1e-3``: LoRA on every linear layer of
  each block, alpha = 2·rank, dropout 0.

Rule: the LoRA unit with the highest held-out exact tool-call rate
(``sft/heldout/act_call_exact``) is LoRA's; a tie goes to the smaller rank, then the smaller lr.
Real success (64 validation tasks × 2 episodes, ``envace eval``) is then measured for that
unit and for ``full``. Every unit is reported, whichever is picked.

    python bench/lora_sft.py --unit full [--keep DIR] [--record]
    python bench/lora_sft.py --unit full --keep DIR --real-success [--record]
    python bench/lora_sft.py --unit r16-lr1e-3 --keep DIR --real-success \
        --model ADAPTER_DIR [--record]    # a saved copy of that unit's adapter

``--real-success`` evaluates the unit kept under ``--keep DIR`` (run first with ``--keep``) in
the real environment: 64 validation tasks × 2 episodes, plain execution (no rehearsal), seed 0,
the checkpoint's own prompt settings; one JSON object with the success rate and wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.record import add_record_flag, record  # noqa: E402
from envace_engine.samplers.embedded.packed import cpu_bf16  # noqa: E402

RECIPE = REPO / "configs" / "study-core-sft.toml"
UNITS: dict[str, list[str]] = {
    "full": [],
    "r16-lr3e-4": ["lora.enabled=true", "lora.rank=16", "lora.alpha=32", "lr=3e-4"],
    "r16-lr1e-3": ["lora.enabled=true", "lora.rank=16", "lora.alpha=32", "lr=1e-3"],
    "r64-lr3e-4": ["lora.enabled=true", "lora.rank=64", "lora.alpha=128", "lr=3e-4"],
    "r64-lr1e-3": ["lora.enabled=true", "lora.rank=64", "lora.alpha=128", "lr=1e-3"],
}


def run_unit(unit: str, root: Path) -> dict[str, object]:
    """Run one unit under ``root``; its measurements."""
    sets = [f"root={root}", f"run_id=lora-sft-{unit}", *UNITS[unit]]
    argv = [sys.executable, "-m", "envace_engine.cli", "sft", "--config", str(RECIPE)]
    for item in sets:
        argv += ["--set", item]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    subprocess.run(argv, cwd=REPO, env=env, check=True)
    wall = time.perf_counter() - start
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # this unit's child only
    run_dir = root / "runs" / f"lora-sft-{unit}"
    shards = sorted((run_dir / "metrics").glob("*.parquet"))
    frame = pd.concat([pd.read_parquet(f) for f in shards])
    held = frame[
        frame["name"].str.startswith("sft/heldout/") & ~frame["name"].str.contains("/template/")
    ]
    metrics = {str(r.name): round(float(r.value), 4) for r in held.itertuples()}
    model = run_dir / "model"
    size = sum(f.stat().st_size for f in model.rglob("*") if f.is_file())
    return {
        "unit": unit,
        "overrides": UNITS[unit],
        "wall_s": round(wall, 1),
        "peak_rss_gb": round(peak_kb / 2**20, 2),
        "saved_mb": round(size / 2**20, 1),
        "cpu_bf16": cpu_bf16() or "none (fp32)",
        **metrics,
    }


EVAL_TASKS, EVAL_REPEATS = 64, 2


def real_success(unit: str, root: Path, model: Path | None = None) -> dict[str, object]:
    """``envace eval`` of the unit kept under ``root`` (or of ``model``, e.g. a committed
    adapter of that unit): success over 64 tasks × 2 episodes, the run written under ``root``."""
    model = model or root / "runs" / f"lora-sft-{unit}" / "model"
    if not model.is_dir():
        raise SystemExit(f"no kept model at {model}: run --unit {unit} --keep {root} first")
    run_dir = root / "runs" / f"lora-sft-{unit}-eval"
    argv = [sys.executable, "-m", "envace_engine.cli", "eval", "--model", str(model)]
    argv += ["--suite", "toy", "--split", "validation", "--n-tasks", str(EVAL_TASKS)]
    argv += ["--repeats", str(EVAL_REPEATS), "--seed", "0", "--run-dir", str(run_dir)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    out = subprocess.run(argv, cwd=REPO, env=env, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - start
    metrics = json.loads(out.stdout.strip().splitlines()[-1])  # the command's last line
    return {
        "unit": unit,
        "real_success_tasks": EVAL_TASKS,
        "real_success_repeats": EVAL_REPEATS,
        "eval_wall_s": round(wall, 1),
        "cpu_bf16": cpu_bf16() or "none (fp32)",
        **{k: v for k, v in metrics.items() if k.startswith("eval/")},
    }


def main() -> None:
    """Run ``--unit`` and print its JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unit", choices=sorted(UNITS), required=True)
    parser.add_argument("--keep", type=Path, help="keep the run under this folder")
    parser.add_argument(
        "--real-success", action="store_true", help="evaluate the unit kept under --keep"
    )
    parser.add_argument(
        "--model", type=Path, help="with --real-success: this saved model or adapter instead"
    )
    add_record_flag(parser)
    args = parser.parse_args()
    if args.real_success:
        if args.keep is None:
            raise SystemExit("--real-success evaluates a kept unit: give --keep DIR")
        result = real_success(args.unit, args.keep, args.model)
    elif args.keep is not None:
        result = run_unit(args.unit, args.keep)
    else:
        with tempfile.TemporaryDirectory() as root:
            result = run_unit(args.unit, Path(root))
    if args.record:
        record(__file__, result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
