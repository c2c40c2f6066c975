"""Where one role-wise GRPO training step's time goes: op categories and step phases.

The workload is ``bench/train_step.py``'s (8 rows x 512 tokens, 384 prompt + 128 completion,
micro-batches of ``--token-budget`` padded tokens; ``--quick``: 4 rows x 64 tokens), run as its
``ours`` variant with bf16 autocast where the CPU has a native bf16 unit (``--fp32``: without),
for one untimed warm-up step and then one step under ``torch.profiler`` (CPU, in this process).
Ops are put in ``bench/rollout_profile.py``'s categories by name (self CPU time), ``framework``
is the rest of the step's wall time, and ``phases`` gives the inclusive wall seconds of the
step's three parts (``forward``: the micro-batches' scoring and loss, ``backward``,
``optimizer``: clipping-free AdamW step), measured with ``time.perf_counter`` around each.

The GEMM share says how far the step is from its arithmetic: ``gemm_gflop`` counts the
step's matrix-product FLOPs from the model's shapes (forward 2·N·P over the transformer's
linear layers on every token, the LM head on completion tokens only, backward twice that), and
``gemm_gflop_s`` is that over the profiled GEMM seconds. The last line is one JSON object:
``step_s``, ``phases``, ``share``, ``seconds``, ``ops``, ``top``, ``gemm_gflop``,
``gemm_gflop_s``, ``bf16``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.record import add_record_flag, record  # noqa: E402
from bench.rollout_profile import breakdown  # noqa: E402
from bench.train_step import _rows  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def linear_flops(model: Any, tokens: int, completion_tokens: int) -> float:
    """Forward + backward matrix-product FLOPs of one step: 6 per weight per token for the
    decoder's linear layers, and for the LM head on the completion tokens (the only positions
    ``completion_logprobs`` projects)."""
    import torch

    head = model.get_output_embeddings()
    body = sum(
        m.weight.numel()
        for m in model.modules()
        if isinstance(m, torch.nn.Linear) and m is not head
    )
    return 6.0 * (body * tokens + head.weight.numel() * completion_tokens)


def step(model: Any, optimizer: Any, batches: list[Any], autocast: Any) -> dict[str, float]:
    """One optimizer step over the micro-batches; wall seconds per phase."""
    from envace_engine.logprobs import completion_logprobs
    from envace_engine.training.loss import LossInputs, policy_loss

    total_rows = sum(b.num_rows for b in batches)
    phases = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
    optimizer.zero_grad(set_to_none=True)
    for batch in batches:
        start = time.perf_counter()
        with autocast():
            logprobs = completion_logprobs(
                model, batch.input_ids, batch.attention_mask, batch.completion_mask
            )
        out = policy_loss(LossInputs.from_batch(batch, logprobs), total_rows=total_rows)
        middle = time.perf_counter()
        out.loss.backward()
        phases["forward"] += middle - start
        phases["backward"] += time.perf_counter() - middle
    start = time.perf_counter()
    optimizer.step()
    phases["optimizer"] = time.perf_counter() - start
    return phases


def main() -> None:
    """Warm up one step, profile the next; print the JSON last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 rows x 64 tokens (< 1 min)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--token-budget", type=int, default=512)
    parser.add_argument("--fp32", action="store_true", help="no bf16 autocast")
    add_record_flag(parser)
    args = parser.parse_args()
    rows_n, prompt, completion = (4, 48, 16) if args.quick else (8, 384, 128)
    budget = 128 if args.quick else args.token_budget

    import contextlib
    import functools

    import torch
    from torch.profiler import ProfilerActivity, profile

    from envace_engine.models import load_model, resolve
    from envace_engine.samplers.embedded.packed import cpu_bf16
    from envace_engine.training.advantages import row_advantages, scorable
    from envace_engine.training.batching import micro_batches

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = load_model(resolve(args.model)).train()
    rows = _rows(rows_n, prompt, completion, model.config.vocab_size)
    rows, advantages = scorable(rows, row_advantages(rows))
    batches = micro_batches(rows, advantages, model.config.pad_token_id or 0, budget)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    bf16 = not args.fp32 and cpu_bf16() is not None
    autocast = (
        functools.partial(torch.autocast, "cpu", dtype=torch.bfloat16)
        if bf16
        else contextlib.nullcontext
    )
    step(model, optimizer, batches, autocast)  # warm-up: oneDNN primitives, AdamW state
    prof = profile(activities=[ProfilerActivity.CPU])
    start = time.perf_counter()
    with prof:
        phases = step(model, optimizer, batches, autocast)
    wall = time.perf_counter() - start
    events = [(e.key, e.self_cpu_time_total / 1e6, e.count) for e in prof.key_averages() if e.count]
    parts = breakdown(events, wall)
    flop = linear_flops(model, rows_n * (prompt + completion), rows_n * completion)
    out = {
        "model": args.model,
        "quick": args.quick,
        "bf16": bf16,
        "rows": rows_n,
        "tokens_per_row": prompt + completion,
        "micro_batches": len(batches),
        "step_s": round(wall, 3),
        "phases": {k: round(v, 3) for k, v in phases.items()},
        **parts,
        "gemm_gflop": round(flop / 1e9, 1),
        "gemm_gflop_s": round(flop / 1e9 / max(parts["seconds"]["gemm"], 1e-9), 1),
    }
    if args.record:
        record(__file__, out)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
