"""Produce the studio's bundled demo from a finished study: a slice of real runs, nothing made up.

    python scripts/make_demo_bundle.py --study runs/runs/study-toy      # the committed bundle
    python scripts/make_demo_bundle.py --study DIR --out /tmp/bundle --max-mb 30

What goes into ``studio/demo/bundle/`` (a studio opened on an empty data folder copies it in,
``studio.demo``):

* the study run itself (manifest, ``study.json``, ``report.json``, ``report.md``): the Study page
  opens on its table, curves and verdicts;
* every finished (or failed) arm's run with its metrics (the Runs page curves) and the episodes
  of its last ``--episode-steps`` steps (inspector and rehearsed-vs-real pages of the trained
  policies); a study still running is bundled as far as it has got;
* the ``sweep`` evaluation runs of the SFT checkpoint and of the ``envace`` arm, whole (the budget
  page), and the ``envace`` arm's fidelity evaluation (held-out rehearsed vs real pairs).

Checkpoints are never copied. The bundle must stay under ``--max-mb`` (30 MB): the script fails
when it does not, naming the largest runs.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUNDLE = REPO / "studio" / "demo" / "bundle"
EPISODE_TABLES = ("episodes", "segments", "calls", "rehearsals")
STUDY_FILES = ("run.json", "progress.json", "study.json", "report.json", "report.md")


def _copy_files(run: Path, target: Path, names: tuple[str, ...]) -> None:
    for name in names:
        src = run / name
        if src.is_file():
            shutil.copy2(src, target / name)
        elif src.is_dir():
            shutil.copytree(src, target / name)


def copy_run(run: Path, target: Path, last_steps: int | None) -> None:
    """A run's manifest, progress and metrics, and its episode shards (all, or the last
    ``last_steps`` steps'). Checkpoints and pushed weights stay behind."""
    if not (run / "run.json").is_file():
        raise SystemExit(f"{run} is not a run folder (no run.json)")
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    _copy_files(run, target, ("run.json", "progress.json", "metrics"))
    for table in EPISODE_TABLES:
        shards = sorted((run / table).glob("step-*.parquet")) if (run / table).is_dir() else []
        keep = shards if last_steps is None else shards[-last_steps:]
        if keep:
            (target / table).mkdir()
            for shard in keep:
                shutil.copy2(shard, target / table / shard.name)


def size_mb(folder: Path) -> float:
    """Total size of the files under ``folder`` in MB."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20


def evaluation_runs(state: dict) -> list[str]:
    """The SFT checkpoint's and the ``envace`` arm's sweep runs and the ``envace`` fidelity run,
    as the study recorded them (a redone arm's evaluations are ``...-envace-r2``); the fidelity
    run only once evaluated."""
    names = []
    for checkpoint in ("sft", "envace"):
        record = state["evals"].get(checkpoint)
        if record is not None:
            names.append(record["run_id"])
    fidelity = state["evals"].get("envace", {}).get("fidelity_run_id", "")
    if fidelity:
        names.append(fidelity)
    return names


def build(study: Path, out: Path, episode_steps: int) -> dict[str, float]:
    """Write the bundle for the study at ``study`` into ``out``; sizes per run in MB."""
    state = json.loads((study / "study.json").read_text(encoding="utf-8"))
    runs_root = study.parent
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    target = out / study.name
    target.mkdir()
    _copy_files(study, target, STUDY_FILES)
    sizes = {study.name: size_mb(target)}
    for arm in state["arms"].values():
        run = runs_root / arm["run_id"]
        if run.is_dir() and arm["status"] in ("done", "failed"):  # not an arm still training
            copy_run(run, out / run.name, episode_steps)
            sizes[run.name] = size_mb(out / run.name)
    for name in evaluation_runs(state):
        run = runs_root / name
        if run.is_dir():
            copy_run(run, out / name, None)
            sizes[name] = size_mb(out / name)
    return sizes


def main() -> None:
    """Build the bundle and check its size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", type=Path, required=True, help="the study's run folder")
    parser.add_argument("--out", type=Path, default=BUNDLE)
    parser.add_argument("--episode-steps", type=int, default=3, help="arm steps with episodes")
    parser.add_argument("--max-mb", type=float, default=30.0)
    args = parser.parse_args()
    if not (args.study / "study.json").is_file():
        raise SystemExit(f"{args.study} holds no study.json: pass a study's run folder")
    sizes = build(args.study, args.out, args.episode_steps)
    total = sum(sizes.values())
    print(json.dumps({"bundle": str(args.out), "total_mb": round(total, 2), "runs": sizes}))
    if total > args.max_mb:
        biggest = sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
        raise SystemExit(f"bundle is {total:.1f} MB > {args.max_mb} MB; largest: {biggest}")


if __name__ == "__main__":
    main()
