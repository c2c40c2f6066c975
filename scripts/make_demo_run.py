"""Produce the demo run bundled with the studio, from a real small training run.

Runs ``envace train`` (EnvACE mode: rehearsal rollouts with shadow real execution, role-wise
GRPO) on the embedded model for a step or two, then copies the run's data — manifest, progress
and Parquet shards, not the checkpoints — into ``studio/demo/bundle/<run_id>``. A studio opened on
an empty data folder copies that bundle in on first start (studio.demo), so a fresh Space or
laptop shows real episodes at once. Nothing in the bundle is written by hand.

    python scripts/make_demo_run.py                 # smollm2-135m, 2 steps (several minutes)
    python scripts/make_demo_run.py --quick         # tiny model, 1 step (checks the pipeline)
    python scripts/make_demo_run.py --from-run runs/runs/toy-envace   # bundle an existing run

The committed bundle is made by ``scripts/make_demo_bundle.py`` from the reproduction study;
this script adds one training run's folder to it (``--out`` elsewhere keeps them apart).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomli_w

REPO = Path(__file__).resolve().parent.parent
BUNDLE = REPO / "studio" / "demo" / "bundle"
DATA = ("run.json", "progress.json", "episodes", "segments", "calls", "rehearsals", "metrics")


def config(model: str, steps: int, root: Path, run_id: str) -> dict[str, object]:
    """A small EnvACE run: two worked examples in the prompt so the base model calls tools."""
    return {
        "model": model,
        "suite": "toy",
        "split": "train",
        "mode": "envace",
        "reward": "state",
        "steps": steps,
        "tasks_per_step": 4,
        "group_size": 2,
        "seed": 0,
        "checkpoint_every": 1000,
        "root": str(root),
        "run_id": run_id,
        "rollout": {
            "max_turns": 2,
            "max_new_tokens_act": 64,
            "max_new_tokens_rehearse": 48,
            "n_examples": 2,
            "temperature": 0.8,
        },
        "optim": {"lr": 1e-5},
    }


def copy_run_data(run: Path, target: Path) -> None:
    """Copy a run's manifest, progress and shards (never its checkpoints) to ``target``."""
    if not (run / "run.json").is_file():
        raise SystemExit(f"{run} is not a run folder (no run.json): pass a runs/<run_id> folder")
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for name in DATA:
        src = run / name
        if src.is_dir():
            shutil.copytree(src, target / name)
        elif src.is_file():
            shutil.copy2(src, target / name)


def main() -> None:
    """Train (or take an existing run), then copy the run's data into the bundle folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--run-id", default="demo-envace")
    parser.add_argument("--out", type=Path, default=BUNDLE)
    parser.add_argument("--quick", action="store_true", help="tiny model, one step")
    parser.add_argument("--from-run", type=Path, help="bundle this existing run instead")
    args = parser.parse_args()
    if args.from_run is not None:
        copy_run_data(args.from_run, args.out / args.from_run.name)
        print(json.dumps({"run_id": args.from_run.name, "bundle": str(args.out)}))
        return
    model, steps = ("tiny", 1) if args.quick else (args.model, args.steps)
    with tempfile.TemporaryDirectory(prefix="envace-demo-") as tmp:
        root = Path(tmp)
        cfg = root / "demo.toml"
        cfg.write_text(tomli_w.dumps(config(model, steps, root, args.run_id)))
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "envace_engine.cli", "train", "--config", str(cfg)], check=True
        )
        target = args.out / args.run_id
        copy_run_data(root / "runs" / args.run_id, target)
        print(
            json.dumps(
                {
                    "run_id": args.run_id,
                    "model": model,
                    "steps": steps,
                    "train_s": round(time.perf_counter() - start, 1),
                    "bundle": str(target),
                }
            )
        )


if __name__ == "__main__":
    main()
