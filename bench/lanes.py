"""Work per second of study units side by side in lanes vs one at a time (docs/study.md, Lanes).

A study with ``lanes = L`` runs L units at once, each a process of ``cores // L`` threads
(``study.lanes.lane_threads``, which this bench calls too). This bench times the study's two
kinds of unit as the repo's own bench scripts run them, each job in a fresh subprocess:

* ``train`` — an arm's steps: ``bench/study_step.py --variants bf16 --steps S`` (the study
  config's ``envace`` arm, bf16 as the study trains);
* ``eval`` — a checkpoint's evaluation: ``bench/eval_profile.py --n-tasks T`` (the study's
  settings on T held-out tasks x 2 repeats).

``--pair`` names the L jobs (``train+eval``, the common case of a study in two lanes, is the
default; ``train+train`` and ``eval+eval`` too). Each round runs them twice, alternating which
comes first from round to round:

* ``sequential`` — one job after the other, each alone with every core (``lanes = 1``);
* ``lanes`` — all L started together, each with ``cores // L`` threads.

Figures (medians over rounds): each job's wall seconds both ways (``{job}_solo_s``,
``{job}_lane_s``) and its peak RSS in lanes (``ru_maxrss`` of the job and its children, from
``wait4``); ``lanes_peak_sum_mb``, the sum of the lane jobs' peaks (what the machine must hold
when the peaks meet). ``ratio`` = the lanes' work per second relative to one job at a time,
``sum(solo_s / lane_s)`` over the L jobs: each lane runs its job at ``solo_s / lane_s`` of the
speed it would have alone, and in a study a lane that finishes claims the next unit, so the
rates add up (> 1: lanes are faster). ``wall_ratio`` = ``sum(solo_s) / max(lane_s)`` for these
very jobs (lower than ``ratio`` when the jobs' lengths differ: the shorter one's lane idles).
The defaults size the two jobs to similar lengths on the 2-core machine. ``--quick``: both jobs
with their own ``--quick`` (the ``tiny`` model; the plumbing, not the figures).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.record import add_record_flag, record
from recipes.study.lanes import lane_threads

ROOT = Path(__file__).resolve().parents[1]
PAIRS = ("train+eval", "train+train", "eval+eval")


def job_argv(kind: str, args: argparse.Namespace) -> list[str]:
    """The bench script that does one unit of work of ``kind``."""
    if kind == "train":
        argv = [str(ROOT / "bench" / "study_step.py"), "--variants", "bf16"]
        argv += ["--config", args.config, "--steps", str(args.steps)]
    else:
        argv = [str(ROOT / "bench" / "eval_profile.py"), "--config", args.config]
        argv += ["--model", args.model, "--n-tasks", str(args.n_tasks)]
    return [sys.executable, *argv, *(["--quick"] if args.quick else [])]


def run_together(argvs: list[list[str]], threads: int, log_dir: Path) -> list[dict]:
    """Start every job at once with ``threads`` threads each; per job its wall seconds and
    peak RSS (MB), in the order given. A job that fails stops the bench with its log's tail."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    started = time.perf_counter()
    procs = {}
    for i, argv in enumerate(argvs):
        log = (log_dir / f"job-{i}.log").open("wb")
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        procs[proc.pid] = (i, proc, log)
    out: list[dict] = [{} for _ in argvs]
    while procs:
        pid, status, usage = os.wait4(-1, 0)
        if pid not in procs:
            continue
        i, proc, log = procs.pop(pid)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        log.close()
        if proc.returncode != 0:
            tail = (log_dir / f"job-{i}.log").read_text(errors="replace")[-2000:]
            raise SystemExit(f"{' '.join(argvs[i])} exited with {proc.returncode}:\n{tail}")
        wall = time.perf_counter() - started
        out[i] = {"wall_s": round(wall, 2), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1)}
    return out


def one_round(kinds: list[str], args: argparse.Namespace, cores: int, flip: bool) -> dict:
    """Sequential (every core, one job at a time) and lanes (all at once, each with the threads
    a study's lane gets), in either order."""
    argvs = [job_argv(kind, args) for kind in kinds]
    result: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("lanes", "sequential") if flip else ("sequential", "lanes"):
            if mode == "lanes":
                result["lanes"] = run_together(argvs, lane_threads(len(kinds)), Path(tmp))
            else:
                result["sequential"] = [run_together([a], cores, Path(tmp))[0] for a in argvs]
            print(json.dumps({mode: result[mode]}), file=sys.stderr)
    return result


def summarize(kinds: list[str], rounds: list[dict]) -> dict:
    """Medians per job; ``ratio`` and ``wall_ratio`` from them (module docstring)."""
    names = [f"{kind}{i}" if kinds.count(kind) > 1 else kind for i, kind in enumerate(kinds)]

    def median(mode: str, i: int, key: str) -> float:
        return round(statistics.median(r[mode][i][key] for r in rounds), 2)

    out: dict = {}
    solo = [median("sequential", i, "wall_s") for i in range(len(kinds))]
    lane = [median("lanes", i, "wall_s") for i in range(len(kinds))]
    for i, name in enumerate(names):
        out[f"{name}_solo_s"], out[f"{name}_lane_s"] = solo[i], lane[i]
        out[f"{name}_lane_peak_rss_mb"] = median("lanes", i, "peak_rss_mb")
    out["lanes_peak_sum_mb"] = round(sum(out[f"{n}_lane_peak_rss_mb"] for n in names), 1)
    out["ratio"] = round(sum(s / t for s, t in zip(solo, lane, strict=True)), 3)
    out["wall_ratio"] = round(sum(solo) / max(lane), 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model: the plumbing only")
    parser.add_argument("--pair", default="train+eval", choices=PAIRS, help="the lanes' jobs")
    parser.add_argument("--config", default="configs/study-toy.toml", help="study config")
    parser.add_argument("--model", default="runs/runs/study-sft/model", help="eval checkpoint")
    parser.add_argument("--steps", type=int, default=4, help="train job: steps")
    parser.add_argument("--n-tasks", type=int, default=16, help="eval job: held-out tasks")
    parser.add_argument("--rounds", type=int, default=1, help="rounds (medians over them)")
    add_record_flag(parser)
    args = parser.parse_args()
    if args.quick:  # the children's own --quick sizes (study_step: 1 step; eval_profile: 4 tasks)
        args.rounds, args.steps, args.n_tasks = 1, 1, 4
    if not args.quick and not Path(args.model).is_dir():
        raise SystemExit(
            f"--model {args.model}: no such checkpoint; train it with `envace sft --config "
            "configs/study-sft.toml`, pass another checkpoint, or use --quick"
        )
    cores = len(os.sched_getaffinity(0))
    kinds = args.pair.split("+")
    rounds = [one_round(kinds, args, cores, flip=r % 2 == 1) for r in range(args.rounds)]
    summary = {"pair": args.pair, "cores": cores, "threads_per_lane": lane_threads(len(kinds))}
    summary.update(steps=args.steps, n_tasks=args.n_tasks, quick=args.quick, rounds=args.rounds)
    summary.update(summarize(kinds, rounds))
    if args.record:
        record(__file__, summary)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
