"""Where the embedded engine's time goes on the rollout bench's workload: op categories.

The workload is ``bench/rollout_throughput.py``'s (one GRPO step from the study's SFT
checkpoint when present: 8 tasks x group 4, rehearsal mode; ``--quick``: 2 x 2, one reply, 24
tokens), rolled out once by this checkout's ``HFSampler`` under ``torch.profiler`` (CPU, in this
process; model load not profiled). Each op's *self* CPU time is put in a category by its name:

* ``gemm`` — matrix products (``mm``, ``addmm``, ``bmm``, ``linear``, oneDNN/mkldnn ops);
* ``attention`` — fused attention kernels and the cascade merge's log-sum-exp work;
* ``sampling`` — softmax, log-softmax, sort/top-k/multinomial and the like over the vocabulary;
* ``memory`` — copies, concatenations, indexing, fills and allocations;
* ``other`` — every other op (norms, activations, elementwise arithmetic).

``framework`` is the wall time of the rollout left over after every op's self time: Python
(the rollout loop, the session's bookkeeping), the dispatcher and the profiler itself. The
profiler adds a few microseconds per op, so ``tok_s`` here is below the throughput bench's;
the shares are what this script is for. The last line is one JSON object: ``wall_s``,
``tokens``, ``tok_s``, ``ops``, ``share`` (per category and ``framework``, fractions of wall
time), ``seconds`` (the same in seconds) and ``top`` (the 15 ops with the most self time).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "throughput"))

from bench.record import record  # noqa: E402

CATEGORIES = (  # first match wins, so the order matters
    ("attention", ("attention", "flash", "sdpa", "logaddexp", "lerp", "sigmoid", "logsumexp")),
    ("gemm", ("mm", "linear", "mkldnn", "onednn", "matmul", "bmm")),
    ("sampling", ("softmax", "multinomial", "topk", "sort", "cumsum", "argmax", "exponential")),
    (
        "memory",
        (
            "copy",
            "cat",
            "index",
            "gather",
            "scatter",
            "fill",
            "zero",
            "empty",
            "clone",
            "contiguous",
            "narrow",
            "slice",
            "select",
            "to",
            "stack",
            "pad",
        ),
    ),
)


def category(name: str) -> str:
    """The category of a profiled op, by its (lower-cased) name."""
    low = name.lower()
    for label, needles in CATEGORIES:
        if any(n in low for n in needles):
            return label
    return "other"


def breakdown(events: list[tuple[str, float, int]], wall_s: float) -> dict[str, Any]:
    """Seconds and wall-time shares per category from ``(name, self_s, calls)`` rows."""
    seconds = {label: 0.0 for label, _ in CATEGORIES} | {"other": 0.0}
    for name, self_s, _ in events:
        seconds[category(name)] += self_s
    seconds["framework"] = max(wall_s - sum(seconds.values()), 0.0)
    top = sorted(events, key=lambda e: -e[1])[:15]
    return {
        "ops": sum(n for _, _, n in events),
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "share": {k: round(v / wall_s, 3) for k, v in seconds.items()},
        "top": [{"op": n, "self_s": round(s, 3), "calls": c} for n, s, c in top],
    }


def main() -> None:
    """Profile one engine rollout of the throughput bench's workload; print the JSON last."""
    import child  # type: ignore[import-not-found]  # bench/throughput/child.py
    from torch.profiler import ProfilerActivity, profile

    from bench.rollout_throughput import parse_args, workload

    args = parse_args()  # the throughput bench's flags (--quick, --model, --threads, ...)
    args.dtype = "auto"  # the sampler's own choice: bf16 where the CPU has a native unit
    spec = {**workload(args), "engine": "embedded"}
    prof = profile(activities=[ProfilerActivity.CPU])
    result = child.run(spec, around=prof)
    events = [(e.key, e.self_cpu_time_total / 1e6, e.count) for e in prof.key_averages() if e.count]
    out = {
        "model": args.model,
        "quick": args.quick,
        "wall_s": round(result["seconds"], 3),
        "tokens": result["tokens"],
        "tok_s": round(result["tokens"] / result["seconds"], 2),
        **breakdown(events, result["seconds"]),
    }
    if args.record:
        record(__file__, out)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
