"""One role-wise GRPO optimizer step on smollm2-135m: chunked log-probs (ours) vs full logits.

Each variant runs in its own fresh subprocess, so its peak RSS (``ru_maxrss`` of the child) is
measured honestly: model, gradients, AdamW state and the step's activations, nothing shared.

Batch (full mode): 8 rows x 512 tokens = 384 prompt + 128 completion tokens per row, two groups
of 4 trajectories with act and rehearse rows, synthetic token ids and sampler log-probs. The
completion share matters: ours projects only the 8 x 128 completion positions through the LM
head, in vocabulary chunks; naive materialises [8, 512, 49152] fp32 logits (800 MB) and keeps
their log-softmax for the backward pass. Everything else (advantages, batching, loss, AdamW) is
the same code in both.

``ours`` splits the step into micro-batches by a token budget (``--token-budget``, default 512
= 1 row), which is how the trainer runs (``micro_batch_tokens``); ``ours_single`` is the same
without micro-batching and ``naive_micro`` is naive with the same micro-batches, so the JSON
shows what each of the two changes buys on its own.

Prints one JSON object as the last line: peak RSS and median step time per variant,
``ratio`` = ours / naive peak RSS, ``time_ratio`` = ours / naive median wall time per step, and
``cpu_time_ratio`` the same for process CPU time, which stays meaningful when other jobs share
the cores (wall time then mostly measures the neighbours). ``ours_bf16`` is ``ours`` under bf16
autocast (fp32 master weights, gradients and AdamW state, as the trainer's ``bf16 = true``):
``bf16_time_ratio`` and ``bf16_rss_ratio`` are its step time and peak RSS over fp32 ``ours``.
``ours_lora`` is ``ours`` training a rank-16 LoRA adapter on every linear layer of each block
(``[lora]`` defaults) as the trainer does: the optimizer over the adapter only, and the step's
time includes rewriting the sampler's merged copy (``adapters.refresh``), whose memory counts in
its RSS; ``lora_time_ratio`` and ``lora_rss_ratio`` are over ``ours``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.record import add_record_flag, record

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

VARIANTS = ("ours", "ours_bf16", "ours_lora", "ours_single", "naive", "naive_micro")
# variants that split the step by --token-budget
MICRO = ("ours", "ours_bf16", "ours_lora", "naive_micro")


def _rows(num_rows: int, prompt_len: int, completion_len: int, vocab: int) -> list:
    """Synthetic step-as-sample rows: 2 groups, alternating act/rehearse, fixed seed."""
    import random

    from envace_engine.types import Role, TrainRow

    rng = random.Random(0)
    rewards = [1.0, 0.0, 0.5, 0.0]
    rows = []
    for i in range(num_rows):
        rows.append(
            TrainRow(
                episode_id=f"ep{i % 4}-g{i // 4}",
                group_id=f"g{i // 4}",
                role=Role.ACT if i % 2 == 0 else Role.REHEARSE,
                prompt_ids=tuple(rng.randrange(vocab) for _ in range(prompt_len)),
                completion_ids=tuple(rng.randrange(vocab) for _ in range(completion_len)),
                old_logprobs=tuple(-rng.uniform(0.0, 4.0) for _ in range(completion_len)),
                reward=rewards[(i // 2) % 4],
            )
        )
    return rows


def _naive_logprobs(model: Any, batch: Any) -> Any:
    """Full logits → log_softmax → gather: the textbook way, [B, L, V] in memory."""
    import torch

    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = logp.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(picked * batch.completion_mask[:, 1:], (1, 0))


def _child(args: argparse.Namespace) -> dict:
    """Run ``args.steps`` optimizer steps of one variant; report step times and peak RSS."""
    import contextlib

    import torch

    from envace_engine import adapters
    from envace_engine.config import LoraSettings
    from envace_engine.logprobs import completion_logprobs
    from envace_engine.models import load_model, resolve
    from envace_engine.training.advantages import row_advantages, scorable
    from envace_engine.training.batching import collate, micro_batches
    from envace_engine.training.lora import trained_model
    from envace_engine.training.loss import LossInputs, policy_loss

    torch.manual_seed(0)
    merged = None
    if args.child == "ours_lora":
        model, merged = trained_model(resolve(args.model), LoraSettings(enabled=True))
        model.train()
    else:
        model = load_model(resolve(args.model)).train()
    rss_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rows = _rows(args.rows, args.prompt_len, args.completion_len, model.config.vocab_size)
    rows, advantages = scorable(rows, row_advantages(rows))
    pad = model.config.pad_token_id or 0
    if args.child in MICRO:
        batches = micro_batches(rows, advantages, pad, args.token_budget)
    else:
        batches = [collate(rows, advantages, pad)]
    total_rows = sum(b.num_rows for b in batches)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    # bf16 compute as the trainer runs it (``bf16 = true``): autocast GEMMs, fp32 master weights,
    # gradients and AdamW state
    bf16 = args.bf16 or args.child.endswith("_bf16")
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    times, cpu_times = [], []
    for _ in range(args.steps):
        start, cpu_start = time.perf_counter(), time.process_time()
        optimizer.zero_grad(set_to_none=True)
        for batch in batches:
            with autocast:
                if args.child.startswith("naive"):
                    logprobs = _naive_logprobs(model, batch)
                else:
                    logprobs = completion_logprobs(
                        model, batch.input_ids, batch.attention_mask, batch.completion_mask
                    )
            out = policy_loss(LossInputs.from_batch(batch, logprobs), total_rows=total_rows)
            out.loss.backward()
        optimizer.step()
        if merged is not None:
            adapters.refresh(model, merged)
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    return {
        "variant": args.child,
        "bf16": bf16,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_mb_after_load": rss_load,
        "step_s": statistics.median(times),
        "step_times": times,
        "cpu_s": statistics.median(cpu_times),
        "micro_batches": len(batches),
    }


def _run_variant(variant: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", variant, *_shared_flags(args)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{variant} child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _shared_flags(args: argparse.Namespace) -> list[str]:
    flags = [
        f"--model={args.model}",
        f"--rows={args.rows}",
        f"--prompt-len={args.prompt_len}",
        f"--completion-len={args.completion_len}",
        f"--steps={args.steps}",
        f"--token-budget={args.token_budget}",
    ]
    return [*flags, "--bf16"] if args.bf16 else flags


def main() -> None:
    """Parse flags, run each variant in a fresh subprocess, print the JSON summary last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small batch, 1 step (< 1 min)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=384)
    parser.add_argument("--completion-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3, help="timed steps; the median is reported")
    parser.add_argument(
        "--token-budget", type=int, default=512, help="padded tokens per micro-batch (ours)"
    )
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast for every variant")
    # (``ours_bf16`` is ``ours`` with bf16 autocast: the bf16-vs-fp32 comparison in one run)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    add_record_flag(parser)
    args = parser.parse_args()
    if args.quick:  # a smoke run of the same code path; the memory claim needs full mode
        args.rows, args.prompt_len, args.completion_len, args.steps = 4, 48, 16, 1
        args.token_budget = 128
        args.variants = "ours,ours_bf16,ours_lora,naive"
    if args.child:
        print(json.dumps(_child(args)))
        return
    variants = args.variants.split(",")
    if not {"ours", "naive"} <= set(variants) <= set(VARIANTS):
        parser.error(f"--variants must include ours and naive, from {', '.join(VARIANTS)}")
    results = {}
    for variant in variants:
        results[variant] = _run_variant(variant, args)
        print(json.dumps(results[variant]), file=sys.stderr)
    ours, naive = results["ours"], results["naive"]
    summary = {
        "rows": args.rows,
        "prompt_len": args.prompt_len,
        "completion_len": args.completion_len,
        "token_budget": args.token_budget,
        "bf16": args.bf16,
        "steps": args.steps,
        "peak_rss_mb_ours": round(ours["peak_rss_mb"], 1),
        "peak_rss_mb_naive": round(naive["peak_rss_mb"], 1),
        "step_s_ours": round(ours["step_s"], 2),
        "step_s_naive": round(naive["step_s"], 2),
        "cpu_s_ours": round(ours["cpu_s"], 2),
        "cpu_s_naive": round(naive["cpu_s"], 2),
        "rss_mb_after_load": round(naive["rss_mb_after_load"], 1),
    }
    for extra in ("ours_bf16", "ours_lora", "ours_single", "naive_micro"):
        if extra in results:
            summary[f"peak_rss_mb_{extra}"] = round(results[extra]["peak_rss_mb"], 1)
            summary[f"step_s_{extra}"] = round(results[extra]["step_s"], 2)
    summary["ratio"] = round(ours["peak_rss_mb"] / naive["peak_rss_mb"], 3)
    summary["time_ratio"] = round(ours["step_s"] / naive["step_s"], 3)
    summary["cpu_time_ratio"] = round(ours["cpu_s"] / naive["cpu_s"], 3)
    if "ours_bf16" in results:  # target: <= 0.5 with peak RSS not higher
        bf16 = results["ours_bf16"]
        summary["bf16_time_ratio"] = round(bf16["step_s"] / ours["step_s"], 3)
        summary["bf16_cpu_time_ratio"] = round(bf16["cpu_s"] / ours["cpu_s"], 3)
        summary["bf16_rss_ratio"] = round(bf16["peak_rss_mb"] / ours["peak_rss_mb"], 3)
    if "ours_lora" in results:
        lora = results["ours_lora"]
        summary["lora_time_ratio"] = round(lora["step_s"] / ours["step_s"], 3)
        summary["lora_rss_ratio"] = round(lora["peak_rss_mb"] / ours["peak_rss_mb"], 3)
    print(json.dumps(summary))
    if args.record:
        record(__file__, summary)


if __name__ == "__main__":
    main()
