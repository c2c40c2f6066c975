"""Bytes a weight push sends to SGLang per step: the full checkpoint against a LoRA adapter.

Measured for SmolLM2-135M: both are written exactly as ``training.parallel.weight_sync`` writes
them (``save_pretrained`` of the merged fp32 model; the adapter's safetensors) and their files
summed. Computed, from the architecture alone, for an 8B Llama (Llama-3-8B's shape: hidden
4096, MLP 14336, 32 layers, 8 K/V heads of 128, vocabulary 128256) in bf16, as a GPU run would
push it. Adapters: rank ``--rank`` on every linear layer of each block (``config.LORA_TARGETS``).

    python bench/lora_sync_bytes.py [--rank 16] [--record]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.record import add_record_flag, record  # noqa: E402
from envace_engine import adapters  # noqa: E402
from envace_engine.config import LoraSettings  # noqa: E402
from envace_engine.models import SMOLLM2, resolve  # noqa: E402
from envace_engine.training.lora import trained_model  # noqa: E402

LLAMA_8B = {
    "hidden": 4096,
    "mlp": 14336,
    "layers": 32,
    "heads": 32,
    "kv_heads": 8,
    "head_dim": 128,
    "vocab": 128256,
    "tied": False,
}


def linear_shapes(a: dict[str, int]) -> list[tuple[int, int]]:
    """(in, out) of each adapted linear layer of one block: q, k, v, o, gate, up, down."""
    h, q, kv, m = a["hidden"], a["heads"] * a["head_dim"], a["kv_heads"] * a["head_dim"], a["mlp"]
    return [(h, q), (h, kv), (h, kv), (q, h), (h, m), (h, m), (m, h)]


def computed(a: dict[str, int], rank: int, bytes_per: int) -> dict[str, float]:
    """Full weights and adapter bytes of architecture ``a`` (no file headers)."""
    block = sum(i * o for i, o in linear_shapes(a))
    embeddings = a["vocab"] * a["hidden"] * (1 if a["tied"] else 2)
    full = a["layers"] * (block + 2 * a["hidden"]) + embeddings + a["hidden"]
    lora = a["layers"] * sum(rank * (i + o) for i, o in linear_shapes(a))
    return {"full_gb": full * bytes_per / 1e9, "adapter_mb": lora * bytes_per / 1e6}


def measured(rank: int) -> dict[str, float]:
    """SmolLM2-135M's full checkpoint and adapter, written as a push writes them."""
    spec = resolve(SMOLLM2)
    model, merged = trained_model(spec, LoraSettings(enabled=True, rank=rank, alpha=2 * rank))
    assert merged is not None  # lora enabled: the sampler's merged copy
    with tempfile.TemporaryDirectory() as tmp:
        merged.save_pretrained(Path(tmp) / "full", safe_serialization=True)
        adapters.save(model, Path(tmp) / "adapter")
        full = sum(f.stat().st_size for f in (Path(tmp) / "full").iterdir())
        adapter = sum(f.stat().st_size for f in (Path(tmp) / "adapter").iterdir())
    return {"full_mb": full / 1e6, "adapter_mb": adapter / 1e6}


def main() -> None:
    """Print (and with --record append) the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=16)
    add_record_flag(parser)
    args = parser.parse_args()
    small = measured(args.rank)
    big = computed(LLAMA_8B, args.rank, bytes_per=2)
    result = {
        "rank": args.rank,
        "smollm2_135m_fp32": {k: round(v, 1) for k, v in small.items()},
        "smollm2_ratio": round(small["full_mb"] / small["adapter_mb"], 1),
        "llama_8b_bf16_computed": {k: round(v, 2) for k, v in big.items()},
        "llama_8b_ratio": round(big["full_gb"] * 1e3 / big["adapter_mb"], 1),
    }
    if args.record:
        record(__file__, result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
