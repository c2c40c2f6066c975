"""One decode step of the embedded sampler: the compact Llama step against the model's own
forward, on the same session state, in the same process, alternating round by round.

Workload: ``--rows`` requests (``--group`` per distinct prompt, like GRPO groups) of
``--prompt-len`` random token ids each, greedy, decoded ``--steps`` steps after they joined
(the prompts' prefill is not timed). Both variants run the same ``HFSampler`` settings
(packed weights, the compute dtype ``auto`` picks, prefix reuse), differing only in
``compact_decode``. A step's time is the wall time of ``DecodeSession.step`` (forward,
sampling, bookkeeping); each variant's figure is the median over steps of every round.

Two of the step's pieces are also timed alone (median of ``KERNEL_CALLS`` calls), because the
engine chooses between them: the LM head as a packed GEMM in fp32 and in bf16 at ``--rows``
rows (``head_ms``; bf16 only where oneDNN's bf16 linear runs), and attention over a row's own
columns — ``--rows`` rows x the model's K/V heads and query groups — by torch's fused CPU flash
kernel and by ``cascade.few_keys_attention`` at 16, 64 and 200 keys (``own_attention_us``).

``--quick``: 8 rows, 12 steps, 1 round (same JSON keys). The last line is one JSON object:
``plain_ms``, ``compact_ms`` (median step), ``speedup`` (plain / compact), ``plain_tokens``
and ``compact_tokens`` (generated in the timed steps: equal unless a row stopped early),
``head_ms``, ``own_attention_us``, ``rows``, ``prompt_len``, ``dtype``, ``model``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.record import add_record_flag, record  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SFT = ROOT / "runs" / "runs" / "study-sft" / "model"
KERNEL_CALLS = 50
OWN_KEYS = (16, 64, 200)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small workload, under a minute")
    parser.add_argument("--model", default=None, help="default: the study's SFT, else smollm2")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--group", type=int, default=4, help="rows per distinct prompt")
    parser.add_argument("--prompt-len", type=int, default=600)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    add_record_flag(parser)
    args = parser.parse_args()
    if args.quick:
        args.rows, args.steps, args.repeats = 8, 12, 1
    if args.rows < 1 or args.group < 1 or args.steps < 1 or args.prompt_len < 2:
        parser.error("--rows, --group, --steps need >= 1 and --prompt-len >= 2")
    return args


def step_times(sampler: Any, prompts: list[list[int]], steps: int) -> tuple[list[float], int]:
    """Seconds of each decode step after every request joined (the first step, which
    prefills the prompts, is not counted), and the tokens those steps generated."""
    from envace_engine.samplers.base import SamplingParams

    params = SamplingParams(max_new_tokens=steps + 1, temperature=0.0)
    stops = frozenset(sampler.stop_ids)
    times = []
    with sampler.session(params) as session:
        for i, prompt in enumerate(prompts):
            session.submit(i, prompt, steps + 1, stops)
        session.step()  # admit + prefill + first token
        busy = sum(r is not None for r in session.rows)
        tokens = 0
        for _ in range(steps):
            start = time.perf_counter()
            session.step()
            times.append(time.perf_counter() - start)
            tokens += busy
            busy = sum(r is not None for r in session.rows)
    return times, tokens


def median_us(fn: Any) -> float:
    """Median wall time of ``fn()`` in microseconds, after a few untimed calls."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(KERNEL_CALLS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


def head_ms(model: Any, rows: int) -> dict[str, float]:
    """The LM head as one packed GEMM at ``rows`` rows, per dtype oneDNN runs here."""
    import torch

    from envace_engine.samplers.embedded.packed import ROWS_HINT, onednn_bf16

    weight = model.get_output_embeddings().weight.detach()
    call = torch.ops.mkldnn._linear_pointwise
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        if dtype == torch.bfloat16 and not onednn_bf16():
            continue
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.to(dtype), ROWS_HINT)
        x = torch.randn(rows, weight.shape[1]).to(dtype)
        us = median_us(lambda x=x, w=packed: call(x, w, None, "none", [], ""))
        out[str(dtype).removeprefix("torch.")] = round(us / 1000, 2)
    return out


def own_attention_us(sampler: Any, rows: int) -> dict[str, dict[str, float]]:
    """A row's own columns attended by the flash kernel and by ``few_keys_attention``."""
    import torch

    from envace_engine.samplers.embedded import cascade

    s = sampler.kv_shape
    heads = sampler.model.config.num_attention_heads
    q = torch.randn(rows, s.kv_heads, heads // s.kv_heads, s.head_dim)
    scale = s.head_dim**-0.5
    out = {}
    for keys in OWN_KEYS:
        k, v = (torch.randn(rows, s.kv_heads, keys, s.head_dim) for _ in range(2))
        mask = torch.zeros(rows, 1, 1, keys)
        mask[: rows // 2, ..., : keys // 2] = float("-inf")  # rows that joined late
        args = (q, k, v, mask, scale)
        flash = median_us(lambda a=args: cascade.attention_with_lse(*a))
        few = median_us(lambda a=args: cascade.few_keys_attention(*a))
        out[str(keys)] = {"flash": round(flash, 1), "few_keys": round(few, 1)}
    return out


def main() -> None:
    args = parse_args()
    import torch

    from envace_engine.models import SMOLLM2, load_model, load_tokenizer, resolve
    from envace_engine.samplers.embedded.sampler import HFSampler

    torch.set_num_threads(args.threads)
    name = args.model or (str(SFT) if SFT.exists() else SMOLLM2)
    spec = resolve(name)
    model, tokenizer = load_model(spec), load_tokenizer(spec)
    rng = random.Random(0)
    distinct = [
        [rng.randrange(1000, 40000) for _ in range(args.prompt_len)]
        for _ in range(-(-args.rows // args.group))
    ]
    prompts = [distinct[i // args.group] for i in range(args.rows)]
    variants = {
        # no prefix cache across sessions: every round prefills its prompts afresh
        variant: HFSampler(
            model, tokenizer, batch_size=args.rows, prefix_cache_tokens=0, compact_decode=compact
        )
        for variant, compact in (("plain", False), ("compact", True))
    }
    for sampler in variants.values():  # untimed: oneDNN primitives, allocator warm-up
        step_times(sampler, prompts[: args.group], 2)
    times: dict[str, list[float]] = {name: [] for name in variants}
    tokens = dict.fromkeys(variants, 0)
    for _ in range(args.repeats):
        for variant, sampler in variants.items():
            seconds, generated = step_times(sampler, prompts, args.steps)
            times[variant] += seconds
            tokens[variant] += generated
    plain, compact = (1000 * statistics.median(times[n]) for n in ("plain", "compact"))
    result = {
        "bench": "decode_step",
        "quick": args.quick,
        "model": Path(name).name,
        "rows": args.rows,
        "group": args.group,
        "prompt_len": args.prompt_len,
        "steps": args.steps,
        "repeats": args.repeats,
        "threads": args.threads,
        "dtype": variants["compact"].compute_dtype,
        "plain_ms": round(plain, 2),
        "compact_ms": round(compact, 2),
        "speedup": round(plain / compact, 3),
        "plain_tokens": tokens["plain"],
        "compact_tokens": tokens["compact"],
        "head_ms": head_ms(model, args.rows),
        "own_attention_us": own_attention_us(variants["compact"], args.rows),
    }
    if args.record:
        record(__file__, result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
