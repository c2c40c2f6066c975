"""Token sampling from logits, as pure functions (the embedded sampler's conventions).

The log-prob of a sampled token is ``log_softmax(logits / temperature)`` before top-k/top-p
truncation (SGLang/TRL); greedy decoding (temperature < 1e-6) returns ``log_softmax(logits)``.
"""

from __future__ import annotations

import torch

from envace_engine.samplers.base import SamplingParams
from envace_engine.samplers.validation import is_greedy


def pick_tokens(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return ``(token_ids_B, logprobs_B)`` of the sampling distribution.

    The log-prob is taken from ``log_softmax(logits / temperature)`` *before* top-k/top-p
    truncation (SGLang/TRL), so a trainer recomputing it teacher-forced gets the same number.
    """
    if is_greedy(params):
        logp = torch.log_softmax(logits, dim=-1)
        tokens = logits.argmax(dim=-1)
        return tokens, logp.gather(1, tokens[:, None]).squeeze(1)
    scaled = logits / params.temperature
    logp = torch.log_softmax(scaled, dim=-1)
    if 0 < params.top_k < scaled.shape[-1] or params.top_p < 1.0:
        probs = torch.softmax(truncate_logits(scaled, params.top_k, params.top_p), dim=-1)
    else:  # nothing truncated: the sampling distribution is exp(logp)
        probs = logp.exp()
    tokens = sample_categorical(probs, generator)
    return tokens, logp.gather(1, tokens[:, None]).squeeze(1)


CDF_BLOCK = 256  # tokens per block of the two-level inverse CDF


def sample_categorical(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One index per row of ``probs`` by inverse CDF: one uniform draw per row.

    ``torch.multinomial`` over SmolLM2's 49152-token vocabulary is slow on a CPU (as is any
    method drawing one random number per token). Here the draw ``u`` (float64,
    scaled by the row's total mass) is located in two levels: first the block of
    ``CDF_BLOCK`` tokens whose float64 cumulative block mass passes ``u``, then the token
    inside that block, so only block sums and one block per row are ever accumulated. Float64
    keeps the cumulative sums exact enough that no token's probability is biased; a draw
    landing on a zero-probability token (possible only through rounding at the end of a sum)
    is replaced by the row's most likely token.
    """
    rows, vocab = probs.shape
    pad = -vocab % CDF_BLOCK
    blocks = torch.nn.functional.pad(probs, (0, pad)) if pad else probs
    blocks = blocks.view(rows, -1, CDF_BLOCK)
    mass = blocks.sum(dim=-1, dtype=torch.float64)  # [rows, blocks]
    cdf = mass.cumsum(dim=-1)
    draw = torch.rand((rows, 1), generator=generator, dtype=torch.float64, device=probs.device)
    draw = draw * cdf[:, -1:]
    block = torch.searchsorted(cdf, draw, right=True).clamp(max=mass.shape[1] - 1)
    rest = draw - (cdf.gather(1, block) - mass.gather(1, block))  # mass left inside the block
    inside = blocks.gather(1, block[:, :, None].expand(rows, 1, CDF_BLOCK)).squeeze(1)
    within = torch.searchsorted(inside.double().cumsum(dim=-1), rest, right=True)
    index = (block * CDF_BLOCK + within.clamp(max=CDF_BLOCK - 1)).squeeze(1)
    index = index.clamp(max=vocab - 1)
    possible = probs.gather(1, index[:, None]).squeeze(1) > 0
    if bool(possible.all()):  # nearly always: skip a pass over the whole vocabulary
        return index
    return torch.where(possible, index, probs.argmax(dim=-1))


def truncate_logits(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) tokens outside the top-k and outside the top-p nucleus of each row.

    The nucleus keeps the smallest set of most likely tokens whose mass reaches ``top_p``
    (a token is kept when the mass strictly before it is below ``top_p``; the top token always).
    """
    out = scaled
    if 0 < top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k, dim=-1).values[:, -1:]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(out, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop_sorted = mass_before >= top_p
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out
