"""Resident memory of one study evaluation setting, and what the embedded sampler's K/V holds.

Runs one setting of a study's held-out evaluation (``study.evaluation.evaluate_settings``, as
``envace study`` does: the study config's tasks, repeats, rollout and memory settings, the
sampler at ``--slots`` decode slots) on a checkpoint, in this process. Every time an episode
finishes (the sink's progress callback, on the main thread) it samples the process's resident
memory (``/proc/self/status``) and ``HFSampler.kv_memory()``: the prefix cache's tokens and
bytes and the open decode session's slabs. Sampling at episode ends can miss a short peak
between two of them; ``peak_rss_gb`` is the kernel's own high-water mark (``VmHWM``).

Two variants, each in a fresh subprocess (its peak RSS is its own), one after the other:
``unbounded`` — the prefix cache evicts down to its budget only when a call (a decode session:
a whole rollout) ends, so during an evaluation it keeps every sequence it was given — and
``bounded`` — the same budget also held during a call (``HFSampler(call_cache_tokens=...)``,
what ``envace study`` evaluates with).

Prints one JSON object as the last line: per variant ``peak_rss_gb``, the peaks of
``cache_gb``, ``cache_tokens`` and ``session_gb`` seen, ``kv_share`` (the largest cache +
session bytes seen over the RSS at that moment), the setting's ``success`` and ``wall_s``;
``ratio`` = bounded / unbounded peak RSS (< 1: the bound saves memory), ``time_ratio`` the same
for wall time. ``--quick``: the ``tiny`` model, 4 tasks x 1 repeat, parallel N=1 (the
plumbing, not the figures).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.record import add_record_flag, record

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

GB = 1 << 30


def _status_gb(field: str) -> float:
    """A ``/proc/self/status`` memory field (``VmRSS``, ``VmHWM``) in GiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024 / GB
    raise RuntimeError(f"no {field} in /proc/self/status")


class MemorySink:
    """A ``Sink`` that keeps nothing and samples memory at every progress call."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler
        self.peaks = {"rss_gb": 0.0, "cache_gb": 0.0, "cache_tokens": 0, "session_gb": 0.0}
        self.kv_share = 0.0
        self.samples = 0

    def episodes(self, step: int, episodes: Any) -> None:
        """Episodes are not kept."""

    def metrics(self, step: int, metrics: Any) -> None:
        """Metrics are not kept (the result comes from ``on_setting``)."""

    def progress(self, done: int, total: int, message: str = "") -> None:
        """Sample RSS and the sampler's K/V now."""
        kv = self.sampler.kv_memory()
        rss = _status_gb("VmRSS")
        now = {
            "rss_gb": rss,
            "cache_gb": kv.cache_bytes / GB,
            "cache_tokens": kv.cache_tokens,
            "session_gb": kv.session_bytes / GB,
        }
        for key, value in now.items():
            self.peaks[key] = max(self.peaks[key], value)
        self.kv_share = max(self.kv_share, (now["cache_gb"] + now["session_gb"]) / rss)
        self.samples += 1


def run(args: argparse.Namespace) -> dict:
    """Evaluate the one setting; memory figures and the setting's result."""
    from envace_engine.config import load
    from envace_engine.models import load_model, load_tokenizer, resolve
    from envace_engine.samplers import make_sampler
    from envace_engine.samplers.embedded.sampler import HFSampler
    from recipes.study.config import StudyConfig
    from recipes.study.evaluation import Policy, evaluate_settings, make_rehearser
    from recipes.study.runner import make_plan

    sets = [f"model={json.dumps(args.model)}", f"eval.n_tasks={args.n_tasks}"]
    sets.append(f"eval.repeats={args.repeats}")
    config = load(StudyConfig, args.config, sets)
    plan = make_plan(config)
    chosen = [s for s in plan.settings if s.label == args.setting]
    if not chosen:
        labels = ", ".join(s.label for s in plan.settings)
        raise SystemExit(f"--setting {args.setting!r}: not a setting of the study ({labels})")
    plan = dataclasses.replace(plan, settings=tuple(chosen))
    spec = resolve(config.model)
    tokenizer, model = load_tokenizer(spec), load_model(spec)
    sampler = make_sampler(
        spec,
        model=model,
        tokenizer=tokenizer,
        batch_size=args.slots,
        dtype=config.train.rollout.sampler_dtype,
        prefix_cache_tokens=args.cache_tokens,
        call_cache_tokens=args.call_cache_tokens,
    )
    assert isinstance(sampler, HFSampler), "the bench measures the embedded sampler"
    start = _status_gb("VmRSS")
    sink = MemorySink(sampler)
    results: list[Any] = []
    began = time.perf_counter()
    policy = Policy("bench", sampler, tokenizer, model)
    evaluate_settings(policy, plan, make_rehearser(policy, plan), sink, [], results.append)
    wall = time.perf_counter() - began
    (result,) = results
    success = sum(result.success.values()) / len(result.success)
    return {
        "model": args.model,
        "setting": args.setting,
        "tasks": len(plan.tasks),
        "repeats": plan.repeats,
        "slots": args.slots,
        "cache_tokens_limit": args.cache_tokens,
        "call_cache_tokens": args.call_cache_tokens,
        "compute_dtype": sampler.compute_dtype,
        "peak_rss_gb": round(_status_gb("VmHWM"), 2),
        "rss_at_start_gb": round(start, 2),
        "sampled_peak_rss_gb": round(sink.peaks["rss_gb"], 2),
        "cache_gb": round(sink.peaks["cache_gb"], 2),
        "cache_tokens": sink.peaks["cache_tokens"],
        "session_gb": round(sink.peaks["session_gb"], 2),
        "kv_share": round(sink.kv_share, 3),
        "samples": sink.samples,
        "success": round(success, 4),
        "wall_s": round(wall, 1),
    }


VARIANTS = ("unbounded", "bounded")


def _run_child(variant: str, args: argparse.Namespace) -> dict:
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k in CHILD_FLAGS]
    cmd = [sys.executable, __file__, "--child", variant, *flags, *(["--quick"] * args.quick)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{variant} child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


CHILD_FLAGS = ("config", "model", "setting", "n_tasks", "repeats", "slots", "cache_tokens")


def main() -> None:
    """Parse flags, evaluate each variant in its own process, print the JSON last."""
    from envace_engine.config import EVAL_BATCH_SIZE, EVAL_CACHE_TOKENS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, 4 tasks, parallel N=1")
    parser.add_argument("--config", default="configs/study-toy.toml", help="study config")
    parser.add_argument("--model", default="runs/runs/study-sft/model", help="checkpoint")
    parser.add_argument("--setting", default="sequential N=2", help="the setting's label")
    parser.add_argument("--n-tasks", type=int, default=64, help="held-out tasks")
    parser.add_argument("--repeats", type=int, default=2, help="repeats per task")
    parser.add_argument("--slots", type=int, default=EVAL_BATCH_SIZE, help="decode slots")
    parser.add_argument(
        "--cache-tokens",
        type=int,
        default=EVAL_CACHE_TOKENS,
        help="prefix cache budget (between calls; also during calls in the bounded variant)",
    )
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    add_record_flag(parser)
    args = parser.parse_args()
    if args.quick:
        args.model, args.setting, args.n_tasks, args.repeats = "tiny", "parallel N=1", 4, 1
    if args.child:
        args.call_cache_tokens = args.cache_tokens if args.child == "bounded" else None
        print(json.dumps(run(args)))
        return
    runs = {v: _run_child(v, args) for v in VARIANTS}
    common = ("model", "setting", "tasks", "repeats", "slots", "cache_tokens_limit")
    summary = {k: runs["unbounded"][k] for k in (*common, "compute_dtype")}
    summary["quick"] = args.quick
    summary.update({f"{v}_{k}": r[k] for v, r in runs.items() for k in PER_VARIANT})
    summary["ratio"] = round(runs["bounded"]["peak_rss_gb"] / runs["unbounded"]["peak_rss_gb"], 3)
    summary["time_ratio"] = round(runs["bounded"]["wall_s"] / runs["unbounded"]["wall_s"], 3)
    if args.record:
        record(__file__, summary)
    print(json.dumps(summary))


PER_VARIANT = (
    "peak_rss_gb",
    "sampled_peak_rss_gb",
    "cache_gb",
    "cache_tokens",
    "session_gb",
    "kv_share",
    "success",
    "wall_s",
)


if __name__ == "__main__":
    main()
