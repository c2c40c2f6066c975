"""Seconds per step of one study arm: bf16 (sampler GEMMs and trainer autocast) vs fp32, and
packed vs separate act rows.

The workload is the arm as ``envace study`` trains it: ``--config`` (default
``configs/study-toy.toml``, whose SFT checkpoint must exist) and ``--arm`` (default ``envace``)
give the ``TrainConfig`` through ``StudyConfig.arm_config``, with the held-out probes off. Three
variants, each in its own fresh subprocess so none inherits another's heap or oneDNN caches,
their order rotating round by round:

* ``bf16`` — the study's settings: ``[rollout] sampler_dtype = "auto"`` (bf16 GEMMs where the
  CPU has a native bf16 unit) and ``bf16 = true`` (autocast, fp32 master weights and AdamW),
  an episode's nested act rows scored as one sequence (``pack_episodes``);
* ``fp32`` — ``sampler_dtype = "float32"`` and ``bf16 = false``: the engine before bf16;
* ``unpacked`` — ``bf16`` with ``pack_episodes = false``: every row its own sequence;
* ``mb8192`` — ``bf16`` with micro-batches of up to 8192 tokens (``micro_batch_tokens``), the
  study's budget before 2048: what the smaller budget costs in time and saves in memory.

``--variants bf16,fp32`` runs only those (the others' keys are null).

Both start from the same checkpoint with the same seeds and tasks, so they roll out the same
prompts; the sampled continuations differ only through numerics, and the JSON reports each
variant's sampled tokens per second beside its step time so a difference in lengths shows.

Prints one JSON object as the last line: medians over every step of every round of
``step_s``, ``rollout_s`` and ``train_s`` per variant, ``ratio`` = bf16 / fp32 median step
time (< 1: bf16 is faster), ``rollout_ratio`` and ``train_ratio`` the same for the two parts,
``pack_ratio`` / ``pack_train_ratio`` = bf16 / unpacked step and training time,
``micro_ratio`` / ``micro_rss_ratio`` / ``micro_train_token_ratio`` = bf16 / mb8192 step time,
peak RSS and training time per forward token, the median
``forward_tokens`` per step of each variant (what packing saves), its median
``logprob_diff`` and ``mismatch_kl`` (sampler vs trainer log-probs), each variant's peak RSS
(``ru_maxrss`` of its child) and its ``compute_dtype``. Because the variants' rollouts diverge
after step 0, their steps train different numbers of tokens; ``{variant}_train_ms_per_token``
(median over steps of training time per forward token) and ``train_token_ratio`` (bf16 / fp32
of it) compare the trainer's speed itself. ``--quick``: the ``tiny`` model,
2 tasks x group 2, short replies, 1 step, 1 round.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.record import add_record_flag, record

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# ``--set``-style overrides (``config.build``) on top of the arm's own TrainConfig
VARIANTS = {
    "bf16": ("bf16=true", 'rollout.sampler_dtype="auto"'),
    "fp32": ("bf16=false", 'rollout.sampler_dtype="float32"'),
    "unpacked": ("bf16=true", 'rollout.sampler_dtype="auto"', "pack_episodes=false"),
    "mb8192": ("bf16=true", 'rollout.sampler_dtype="auto"', "micro_batch_tokens=8192"),
}
QUICK = (
    'model="tiny"',
    "tasks_per_step=2",
    "group_size=2",
    "rollout.max_turns=1",
    "rollout.max_new_tokens_act=8",
    "rollout.max_new_tokens_rehearse=8",
)
PERF = (
    "perf/step_s",
    "perf/rollout_s",
    "perf/train_s",
    "perf/tokens_per_s",
    "optim/forward_tokens",
    "rollout/logprob_diff",  # sampler/trainer mismatch: mean |Δ log-prob| on sampled tokens
    "rollout/mismatch_kl",  # and the k3 KL estimate
)


def _arm_config(args: argparse.Namespace, variant: str):
    """The arm's ``TrainConfig`` with the variant's dtypes (probes off, no checkpoints kept)."""
    from envace_engine.config import TrainConfig, build, load
    from recipes.study.config import StudyConfig

    study = load(StudyConfig, args.config)
    data = study.arm_config(args.arm, f"bench-{variant}").model_dump(mode="json")
    # only the run's end writes a checkpoint (outside a step)
    common = (
        f"steps={args.steps}",
        "probe.every=0",
        'report_to="none"',
        f"checkpoint_every={args.steps + 1}",
    )
    return build(TrainConfig, data, (*common, *(QUICK if args.quick else ()), *VARIANTS[variant]))


def _child(args: argparse.Namespace) -> dict:
    """Train ``args.steps`` steps of one variant; its per-step perf metrics and peak RSS."""
    from envace_engine.samplers.embedded.sampler import HFSampler
    from envace_engine.sink import JsonlSink
    from envace_engine.training.trainer import run as train_run
    from envace_engine.training.trainer import setup

    config = _arm_config(args, args.child)
    with tempfile.TemporaryDirectory() as tmp:
        parts = setup(config)
        assert isinstance(parts.sampler, HFSampler), "the bench times the embedded sampler"
        sink = JsonlSink(Path(tmp) / "out")
        started = time.perf_counter()
        train_run(parts, Path(tmp) / "run", sink)
        wall = time.perf_counter() - started
        steps = [json.loads(line) for line in sink.metrics_path.read_text().splitlines()]
    return {
        "variant": args.child,
        "compute_dtype": parts.sampler.compute_dtype,
        "steps": [{k: float(f"{s[k]:.4g}") for k in PERF if k in s} for s in steps],
        "wall_s": round(wall, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def _run_child(variant: str, args: argparse.Namespace) -> dict:
    flags = [f"--config={args.config}", f"--arm={args.arm}", f"--steps={args.steps}"]
    cmd = [sys.executable, __file__, "--child", variant, *flags, *(["--quick"] * args.quick)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{variant} child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(runs: list[dict]) -> dict:
    """Per-variant medians over every step of every round, and the bf16 / fp32 ratios."""
    out: dict = {}
    for variant in VARIANTS:
        mine = [r for r in runs if r["variant"] == variant]
        if not mine:  # left out with --variants: its keys are null
            out.update({f"{variant}_{key.split('/')[1]}": None for key in PERF})
            extra = ("train_ms_per_token", "peak_rss_mb", "compute_dtype")
            out.update({f"{variant}_{key}": None for key in extra})
            continue
        for key in PERF:
            values = [s[key] for r in mine for s in r["steps"] if key in s]
            # a step with nothing scorable trains nothing and reports no forward tokens
            median = statistics.median(values or [0.0])
            out[f"{variant}_{key.split('/')[1]}"] = float(f"{median:.4g}")  # 4 digits
        per_token = [
            1000 * s["perf/train_s"] / s["optim/forward_tokens"]
            for r in mine
            for s in r["steps"]
            if s.get("optim/forward_tokens") and "perf/train_s" in s
        ]
        out[f"{variant}_train_ms_per_token"] = round(statistics.median(per_token or [0.0]), 4)
        out[f"{variant}_peak_rss_mb"] = max(r["peak_rss_mb"] for r in mine)
        out[f"{variant}_compute_dtype"] = mine[0]["compute_dtype"]
    ratios = {
        "ratio": ("bf16_step_s", "fp32_step_s"),
        "rollout_ratio": ("bf16_rollout_s", "fp32_rollout_s"),
        "train_ratio": ("bf16_train_s", "fp32_train_s"),
        "train_token_ratio": ("bf16_train_ms_per_token", "fp32_train_ms_per_token"),
        "rss_ratio": ("bf16_peak_rss_mb", "fp32_peak_rss_mb"),
        "pack_ratio": ("bf16_step_s", "unpacked_step_s"),
        "pack_train_ratio": ("bf16_train_s", "unpacked_train_s"),
        "micro_ratio": ("bf16_step_s", "mb8192_step_s"),
        "micro_rss_ratio": ("bf16_peak_rss_mb", "mb8192_peak_rss_mb"),
        "micro_train_token_ratio": ("bf16_train_ms_per_token", "mb8192_train_ms_per_token"),
    }
    for name, (num, den) in ratios.items():
        a, b = out.get(num), out.get(den)
        out[name] = round(a / b, 3) if a is not None and b else None
    return out


def main() -> None:
    """Parse flags, run the variants alternating in fresh subprocesses, print the JSON last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, 1 step, 1 round")
    parser.add_argument("--config", default="configs/study-toy.toml", help="study config")
    parser.add_argument("--arm", default="envace", help="the arm whose step is timed")
    parser.add_argument("--steps", type=int, default=3, help="steps per child")
    parser.add_argument("--rounds", type=int, default=1, help="runs of every variant, rotating")
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="which to run (default: all)"
    )
    parser.add_argument("--child", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    add_record_flag(parser)
    args = parser.parse_args()
    if args.quick:
        args.steps, args.rounds = 1, 1
    if args.child:
        print(json.dumps(_child(args)))
        return
    runs = []
    names = [v for v in VARIANTS if v in args.variants.split(",")]
    if "bf16" not in names:
        parser.error(f"--variants {args.variants!r}: needs bf16 (every ratio is of bf16)")
    for round_ in range(args.rounds):
        shift = round_ % len(names)
        for variant in names[shift:] + names[:shift]:
            runs.append({**_run_child(variant, args), "round": round_})
            print(json.dumps(runs[-1]), file=sys.stderr)
    summary = {"config": args.config, "arm": args.arm, "steps": args.steps, "quick": args.quick}
    summary.update(summarize(runs), runs=runs)
    if args.record:
        record(__file__, summary)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
