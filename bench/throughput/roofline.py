"""The machine's own limits, measured here, and the rollout roofline they give.

* ``gemm_peak_flops``: the best of a few large square matmuls in the engine's compute dtype
  (bf16 where the CPU has it, else fp32), at the bench's thread count, through both paths a
  CPU matmul can take: ``torch.mm`` (MKL's sgemm in fp32, oneDNN in bf16) and the oneDNN-packed
  linear the engine runs (``samplers/embedded/packed.py``). Whichever is faster on this CPU
  sets the peak, so a slow library path cannot make the engine look close to it.
* ``memory_bandwidth``: the best of a few copies of a 512 MiB buffer (bytes read + written).

A decode step of a batch must read every weight once and do ``2 x params`` FLOPs per token it
computes. A prompt token only needs the layers below the LM head (its K/V), so prefill costs
``2 x (params - head)`` per token; each generated token's forward runs the head too (the first
one is the prompt's last token, whose logits give the first sample). Episodes are sequential
chains (act, then its rehearsal, then the next act …), so a rollout needs at least as many
forward steps as the longest chain has generated tokens, whatever the batching
(``steps_min``). The prompt tokens counted are those an ideal engine must prefill
(``prefill_min``), not what the engine measured prefilled. Each generated token must also read
the K/V of its context; a prompt prefix that other requests share (a GRPO group's prompt,
worked examples) can be read once for all of them, so only each request's private part counts
(``kv_private_tokens``: per generation, its tokens past the longest prefix it shares with any
other recorded prompt, plus half its own length on average). Weights and K/V are counted in
the compute dtype. The roofline time is

    max((steps_min x weight_bytes + kv_private_tokens x kv_bytes_per_token) / bandwidth,
        (2 x params x generated + 2 x (params - head) x prefilled) / gemm_peak)

and ``roofline_tok_s`` = generated tokens over it. Every simplification (shared prefixes read
for free, no attention FLOPs, no sampling cost) makes the bound more optimistic, never less.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

GEMM_N = 2048
COPY_MIB = 512


@dataclass(frozen=True)
class Limits:
    """Measured peak GEMM rate (FLOP/s, in ``dtype``) and memory bandwidth (bytes/s)."""

    dtype: str
    gemm_flops: float
    bandwidth: float


def measure(dtype: str, repeats: int = 5) -> Limits:
    """Best-of-``repeats`` GEMM rate and copy bandwidth on this machine."""
    import torch

    dt = getattr(torch, dtype)
    a, b = torch.randn(GEMM_N, GEMM_N, dtype=dt), torch.randn(GEMM_N, GEMM_N, dtype=dt)
    paths = [lambda: torch.mm(a, b)]
    linear = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
    if linear is not None and torch.backends.mkldnn.is_available():
        packed = torch.ops.mkldnn._reorder_linear_weight(b, GEMM_N)
        paths.append(lambda: linear(a, packed, None, "none", [], ""))
    gemm = float("inf")
    for path in paths:
        path()  # warm-up: the library picks and caches its kernel
        gemm = min(gemm, *(_timed(path) for _ in range(repeats)))
    src = torch.empty(COPY_MIB * 2**20, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)
    copy = min(_timed(lambda: dst.copy_(src)) for _ in range(repeats))
    return Limits(dtype, 2 * GEMM_N**3 / gemm, 2 * src.numel() / copy)


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@dataclass(frozen=True)
class Weights:
    """The matmul weights a forward runs through: ``params`` per generated token (LM head
    included), ``head`` of them in the LM head, ``step_bytes`` read by one decode step."""

    params: int
    head: int
    step_bytes: int


def weights_of(model: Any, dtype_bytes: int) -> Weights:
    """The model's linear layers and LM head (tied to the embedding or not), in the compute
    dtype. The head is an ``nn.Linear`` either way: it is counted once, as the head."""
    import torch

    head_module = model.get_output_embeddings()
    linear = sum(
        m.weight.numel()
        for m in model.modules()
        if isinstance(m, torch.nn.Linear) and m is not head_module
    )
    head = head_module.weight.numel()
    return Weights(linear + head, head, (linear + head) * dtype_bytes)


def kv_bytes_per_token(config: Any, dtype_bytes: int) -> int:
    """K and V of one context token over every layer."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * dtype_bytes


def kv_private_tokens(calls: list[tuple[list[int], int]]) -> float:
    """Sum over generated tokens of the context only that request reads (see module doc).

    ``calls``: (prompt ids, generated length) per generation. The longest prefix a prompt shares
    with any other is found between neighbours in sorted order.
    """
    order = sorted(range(len(calls)), key=lambda i: calls[i][0])
    shared = [0] * len(calls)
    for a, b in itertools.pairwise(order):
        n = _common(calls[a][0], calls[b][0])
        shared[a], shared[b] = max(shared[a], n), max(shared[b], n)
    return sum(n * (len(p) - s + n / 2) for (p, n), s in zip(calls, shared, strict=True))


def prefill_min(calls: list[tuple[list[int], list[int]]]) -> int:
    """Prompt tokens an ideal engine must run through the model for ``calls`` ((prompt ids,
    generated ids) per generation), with an unbounded prefix cache.

    A token's K/V depends on it and everything before it, so it is one node of the prefix tree
    of every sequence the rollout saw. Prefill must compute the nodes of each prompt but its
    last token (which the first decode step feeds), except nodes some decode step computed:
    a generation's prompt and its prompt followed by each generated token but the last. Each
    node counts once, in whatever order the rollout needed them (optimistic).
    """
    decoded: set[int] = set()
    for prompt, made in calls:
        decoded.update(_prefix_hashes([*prompt, *made[:-1]], start=len(prompt)))
    needed: set[int] = set()
    for prompt, _ in calls:
        needed.update(_prefix_hashes(prompt[:-1], start=1))
    return len(needed - decoded)


def _prefix_hashes(tokens: list[int], start: int) -> list[int]:
    """A chained hash of each prefix ``tokens[:k]``, ``k >= start`` (``k >= 1``)."""
    out, h = [], 0
    for k, token in enumerate(tokens, start=1):
        h = hash((h, token))
        if k >= start:
            out.append(h)
    return out


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def roofline_tok_s(
    limits: Limits,
    weights: Weights,
    generated: int,
    prefilled: int,
    steps_min: int,
    kv_bytes: float = 0.0,
) -> dict[str, float | str]:
    """The roofline rate of one rollout, and which bound sets it (``kv_bytes``: K/V read)."""
    t_memory = (steps_min * weights.step_bytes + kv_bytes) / limits.bandwidth
    flops = 2 * weights.params * generated + 2 * (weights.params - weights.head) * prefilled
    t_compute = flops / limits.gemm_flops
    seconds = max(t_memory, t_compute)
    return {
        "roofline_tok_s": generated / seconds,
        "roofline_memory_s": t_memory,
        "roofline_compute_s": t_compute,
        "roofline_bound": "memory" if t_memory >= t_compute else "compute",
    }
