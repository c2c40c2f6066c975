"""Per-token log-probs of completion tokens, without ever materialising [batch, time, vocab] logits.

SmolLM2's vocabulary has 49152 entries: the full fp32 logits of 8 rows x 512 tokens take 800 MB,
and a naive ``log_softmax(logits).gather(...)`` keeps two more tensors that size alive for the
backward pass. Training only needs ``log p(token_t | tokens_<t)`` at the completion positions, so:

1. run the backbone (``model.base_model``) to hidden states ``[B, L, H]``;
2. keep only the hidden states that predict a completion token (``completion_mask[:, 1:]``), so
   memory and compute in the head scale with completion tokens, not all tokens;
3. project those through the LM head ``chunk_size`` tokens at a time (``ChunkedHeadLogProb``):
   the forward keeps one ``[chunk, V]`` logits tile and saves only the log-sum-exp per token; the
   backward recomputes each tile and turns it into the logits gradient in place;
4. scatter the values back to ``[B, L]``, aligned with ``input_ids`` (zero off the completion).

Why not TRL's ``ChunkedLogProbFunction`` / ``add_fused_lm_head`` (docs/platform.md §3): both give
correct values and gradients on CPU, but off Triton devices ``add_fused_lm_head`` scores *every*
position with a 32768-column tile (``[4096, 32768]`` fp32 = 512 MB), and the kernel's torch
fallback makes ~10 elementwise passes per tile, so on CPU its backward is slower than ours
(``bench/train_step.py`` measures the variants). Ours is plain torch: matmul, ``logsumexp``, and
one in-place ``exp``/scale pass.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

DEFAULT_CHUNK_SIZE = 256  # tokens per logits tile: [256, 49152] fp32 is 50 MB


def completion_logprobs(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    prefix_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Log-probs ``[B, L]`` of ``input_ids`` at completion positions, differentiable.

    ``out[b, t] = log softmax(logits(tokens_<t) / temperature)[input_ids[b, t]]`` where
    ``completion_mask[b, t]`` is set, and exactly 0 elsewhere. Position 0 has no context, so it
    can never be a completion position. Gradients flow to the backbone and the LM head (tied
    embeddings included) unless the caller runs it under ``torch.no_grad()``.

    ``prefix_ids`` (``[P]``, optional): tokens every row starts with, *not* included in
    ``input_ids`` (whose rows are then what follows them). The prefix runs through the model
    once and its K/V serve every row (``shared_prefix_hidden``); values and gradients are those
    of the full rows, at a fraction of the cost when rows share a long prompt.
    """
    _check_inputs(model, input_ids, attention_mask, completion_mask, temperature, chunk_size)
    hidden = shared_prefix_hidden(model, input_ids, attention_mask, prefix_ids)
    targets_mask = completion_mask[:, 1:].bool()  # hidden state t predicts token t + 1
    head = model.get_output_embeddings()
    picked = ChunkedHeadLogProb.apply(
        hidden[:, :-1][targets_mask],
        head.weight,
        head.bias,
        input_ids[:, 1:][targets_mask],
        1.0 / temperature,
        chunk_size,
    )
    # masked_scatter keeps an all-masked batch connected to the graph (a differentiable zero).
    shifted = picked.new_zeros(targets_mask.shape).masked_scatter(targets_mask, picked)
    return torch.nn.functional.pad(shifted, (1, 0))


def backbone(model: Any) -> Any:
    """The decoder under the LM head: ``model.base_model`` of a transformers causal LM; of a
    peft (LoRA) model, that of the transformers model it wraps (its adapters live inside it)."""
    unwrap = getattr(model, "get_base_model", None)
    return (unwrap() if callable(unwrap) else model).base_model


def shared_prefix_hidden(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prefix_ids: torch.Tensor | None,
) -> torch.Tensor:
    """Last hidden states ``[B, L, H]`` of ``input_ids``, each row preceded by ``prefix_ids``.

    Without a prefix: one plain forward. With one: the prefix's forward fills a K/V cache, the
    cache is expanded (a view, no copy) to the batch, and the rows run on top of it at positions
    ``P ..``. Autograd sums the rows' gradients into the prefix's single forward — exactly what
    the full rows would give (tests/test_logprobs.py compares both).
    """
    base = backbone(model)
    if prefix_ids is None or prefix_ids.numel() == 0:
        out = base(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return out.last_hidden_state
    rows, length = input_ids.shape
    start = int(prefix_ids.shape[0])
    cache = base(input_ids=prefix_ids[None], use_cache=True).cache
    for layer in cache.layers:
        layer.keys = layer.keys.expand(rows, -1, -1, -1)
        layer.values = layer.values.expand(rows, -1, -1, -1)
    mask = torch.cat([attention_mask.new_ones(rows, start), attention_mask], dim=1)
    positions = torch.arange(start, start + length, device=input_ids.device)[None]
    out = base(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=positions.expand(rows, length),
        cache=cache,
        use_cache=True,
    )
    return out.last_hidden_state


class ChunkedHeadLogProb(torch.autograd.Function):
    """``log_softmax(inv_t * (hidden @ weight.T + bias))[n, targets[n]]`` for ``hidden [N, H]``.

    Memory: one ``[chunk, V]`` fp32 tile at a time, plus ``N`` saved log-sum-exps. Under CPU or
    CUDA autocast the projections run in the autocast dtype, from one cast of the weight that
    the backward reuses; the softmax math and the weight gradient accumulate in fp32, the
    gradient by one in-place fp32 product per chunk (a low-precision product would need two
    fresh ``[V, H]`` temporaries per chunk, which on a CPU cost more in page faults and copies
    than the product: ``bench/train_profile.py``).
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        inv_t: float,
        chunk: int,
    ) -> torch.Tensor:
        """Log-probs ``[N]`` (fp32) of ``targets`` under the temperature-scaled head."""
        device = hidden.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        acc = torch.promote_types(hidden.dtype, torch.float32)  # fp64 stays fp64 (gradcheck)
        lse = torch.empty(hidden.shape[0], device=hidden.device, dtype=acc)
        picked = torch.empty_like(lse)
        with _no_autocast(device):
            w = weight if dtype is None else weight.to(dtype)
            for s in range(0, hidden.shape[0], chunk):
                logits = _tile(hidden[s : s + chunk], w, bias, inv_t, acc)
                lse[s : s + chunk] = torch.logsumexp(logits, dim=-1)
                picked[s : s + chunk] = logits.gather(-1, targets[s : s + chunk, None]).squeeze(-1)
        ctx.save_for_backward(hidden, weight, w, bias, targets, lse)
        ctx.inv_t, ctx.chunk, ctx.acc = inv_t, chunk, acc  # w carries the compute dtype
        return picked - lse

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        """d logp_n / d z_nj = inv_t * (1[j = target_n] - p_nj), folded into each tile in place."""
        hidden, weight, w, bias, targets, lse = ctx.saved_tensors
        needs_h, needs_w, needs_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if needs_h else None
        needs_b = needs_b and bias is not None
        grad_w = torch.zeros(weight.shape, dtype=ctx.acc, device=weight.device) if needs_w else None
        grad_b = (
            torch.zeros(weight.shape[0], dtype=ctx.acc, device=weight.device) if needs_b else None
        )
        with _no_autocast(hidden.device.type):
            for s in range(0, hidden.shape[0], ctx.chunk):
                h = hidden[s : s + ctx.chunk]
                g = grad_out[s : s + ctx.chunk].to(ctx.acc)[:, None] * ctx.inv_t
                tile = _tile(h, w, bias, ctx.inv_t, ctx.acc)
                tile.sub_(lse[s : s + ctx.chunk, None]).exp_().mul_(-g)  # -g * p
                tile.scatter_add_(-1, targets[s : s + ctx.chunk, None], g)  # + g at the target
                if grad_h is not None:  # needs_h
                    grad_h[s : s + ctx.chunk] = tile.to(w.dtype) @ w
                if grad_w is not None:  # needs_w: h as the forward's product saw it
                    grad_w.addmm_(tile.t(), h.to(w.dtype).to(ctx.acc))  # in place, fp32
                if grad_b is not None:  # needs_b
                    grad_b += tile.sum(0)
        return (
            grad_h,
            grad_w.to(weight.dtype) if grad_w is not None else None,
            grad_b.to(bias.dtype) if grad_b is not None else None,
            None,
            None,
            None,
        )


def _tile(
    h: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, inv_t: float, acc: torch.dtype
) -> torch.Tensor:
    """Temperature-scaled logits of one token chunk, in the accumulation dtype ``acc``."""
    logits = (h.to(w.dtype) @ w.t()).to(acc)
    if bias is not None:
        logits += bias.to(acc)
    if inv_t != 1.0:
        logits *= inv_t
    return logits


def _no_autocast(device: str) -> contextlib.AbstractContextManager[Any]:
    """Inside the function we cast explicitly; autocast must not re-cast the fp32 softmax math."""
    if device in ("cpu", "cuda"):
        return torch.autocast(device, enabled=False)
    return contextlib.nullcontext()


def _check_inputs(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float,
    chunk_size: int,
) -> None:
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, length], got shape {tuple(input_ids.shape)}")
    for name, tensor in (("attention_mask", attention_mask), ("completion_mask", completion_mask)):
        if tensor.shape != input_ids.shape:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)} but input_ids has "
                f"{tuple(input_ids.shape)}: build all three with batching.collate"
            )
    if bool(completion_mask[:, 0].bool().any()):
        raise ValueError(
            "completion_mask marks position 0, which has no preceding token to predict it from: "
            "every row needs at least one prompt token before its completion"
        )
    if bool((completion_mask.bool() & ~attention_mask.bool()).any()):
        raise ValueError("completion_mask marks padding positions (attention_mask is 0 there)")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (the sampling temperature), got {temperature}")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive number of tokens, got {chunk_size}")
    config = model.config.get_text_config()
    for name in ("final_logit_softcapping", "logit_scale"):
        if getattr(config, name, None) not in (None, 1.0):
            raise ValueError(
                f"{type(model).__name__} sets {name}={getattr(config, name)}, which the chunked "
                "head does not apply: use a model without logit scaling (Llama, Qwen, SmolLM)"
            )
