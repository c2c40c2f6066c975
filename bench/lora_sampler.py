"""Sampling under LoRA: the merged copy the trainer keeps against the adapter applied beside.

The embedded sampler generates the same batch (``--prompts`` prompts of 64 tokens, 64 new
tokens each, one seed) from (a) the merged copy (``adapters.refresh``: plain linear layers, so
the packed weights and the compact decode step apply) and (b) the peft model itself (base
layers plus the adapter's two small GEMMs per layer, through the model's own forward). It also
times one ``refresh``, the merged copy's cost per optimizer step. Prints one JSON line.

    python bench/lora_sampler.py [--prompts 32] [--record]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.record import add_record_flag, record  # noqa: E402
from envace_engine import adapters  # noqa: E402
from envace_engine.config import LoraSettings  # noqa: E402
from envace_engine.models import SMOLLM2, load_tokenizer, resolve  # noqa: E402
from envace_engine.samplers.base import SamplingParams  # noqa: E402
from envace_engine.samplers.embedded.packed import cpu_bf16  # noqa: E402
from envace_engine.samplers.embedded.sampler import HFSampler  # noqa: E402
from envace_engine.training.lora import trained_model  # noqa: E402


def tok_per_s(sampler: HFSampler, prompts: list[list[int]], new: int) -> float:
    """Generated tokens per second for one batch (after one warm-up call)."""
    params = SamplingParams(max_new_tokens=new, temperature=1.0, seed=0)
    sampler.generate(prompts[:2], SamplingParams(max_new_tokens=4, seed=0))
    start = time.perf_counter()
    gens = sampler.generate(prompts, params)
    return sum(len(g.token_ids) for g in gens) / (time.perf_counter() - start)


def main() -> None:
    """Measure and print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    add_record_flag(parser)
    args = parser.parse_args()
    spec = resolve(SMOLLM2)
    model, merged = trained_model(spec, LoraSettings(enabled=True))
    assert merged is not None
    start = time.perf_counter()
    adapters.refresh(model, merged)
    refresh_s = time.perf_counter() - start
    tokenizer = load_tokenizer(spec)
    prompts = [[(i * 7 + j) % 2000 + 100 for j in range(64)] for i in range(args.prompts)]
    merged_tps = tok_per_s(HFSampler(merged, tokenizer), prompts, args.new_tokens)
    model.eval()
    beside_tps = tok_per_s(HFSampler(model, tokenizer), prompts, args.new_tokens)
    result = {
        "prompts": args.prompts,
        "new_tokens": args.new_tokens,
        "cpu_bf16": cpu_bf16() or "none (fp32)",
        "refresh_s": round(refresh_s, 3),
        "merged_tok_s": round(merged_tps, 1),
        "beside_tok_s": round(beside_tps, 1),
        "merged_over_beside": round(merged_tps / beside_tps, 2),
    }
    if args.record:
        record(__file__, result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
