"""Prefill attention for ``HFSampler``: one prompt's new tokens over its cached prefix (CPU).

Why. A prefill resumes a cached prefix (``kv.PrefixCache``): ``n`` new tokens attend to the
``held`` cached columns and causally to each other. Through transformers' SDPA path that is one
kernel call with an explicit ``[n, held + n]`` mask, after ``repeat_kv`` has copied the whole
K/V to every query head (SmolLM2-135M: 9 query heads on 3 K/V heads, so 3× the bytes, in every
layer of every prefill). Here the two parts run apart and are merged exactly through their
log-sum-exps (``cascade.merge_partials``):

* the cached columns, which every new token sees in full: no mask, and the query heads that
  share a K/V head stacked as query positions of that head (GQA without a copy);
* the new columns: causal among the new tokens, the only part where heads are repeated (``n``
  columns, not ``held + n``).

``bench/decode_step.py`` (``prefill_attention_us``) times both on prefill shapes.

How it plugs in. ``attend`` is registered with transformers' ``AttentionInterface`` under
``NAME``; ``active`` switches the model to it for one prefill forward and back. It assumes what
``HFSampler._prefill`` passes: one sequence, every column real, positions ``held..held+n``; any
other call (a batch, a GPU) goes through SDPA as before.

Numerics: exact algebra; results differ from SDPA by float rounding only (tests compare).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from envace_engine.samplers.embedded.cascade import merge_partials

if TYPE_CHECKING:
    from transformers import PreTrainedModel

NAME = "envace_prefill"
# torch's fused CPU attention kernel, which also returns the log-sum-exp (a private op: without
# it, SDPA runs as before).
_CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def prefill_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    """Causal attention of one sequence's last ``n`` positions: ``q`` ``[1, H, n, D]`` over
    ``k``/``v`` ``[1, Hk, held + n, D]`` (query ``i`` sees columns ``< held + i + 1``);
    returns ``[1, H, n, D]``."""
    if _CPU_FLASH is None:
        raise RuntimeError("this torch build lacks the CPU flash-attention op: use SDPA")
    _, heads, n, dim = q.shape
    kv_heads = k.shape[1]
    g, held = heads // kv_heads, k.shape[2] - n
    new_k = k[:, :, held:].repeat_interleave(g, dim=1)
    new_v = v[:, :, held:].repeat_interleave(g, dim=1)
    out, lse = _CPU_FLASH(q, new_k, new_v, 0.0, True, scale=scale)
    if not held:
        return out
    stacked = q.reshape(1, kv_heads, g * n, dim)  # head h's queries: rows h*g*n .. (h+1)*g*n
    out_c, lse_c = _CPU_FLASH(stacked, k[:, :, :held], v[:, :, :held], 0.0, False, scale=scale)
    out_c, lse_c = out_c.reshape(1, heads, n, dim), lse_c.reshape(1, heads, n)
    merged, _ = merge_partials(out_c, lse_c, out, lse)
    return merged


def attend(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function for ``HFSampler._prefill`` (see the module docstring):
    ``attention_mask`` is not read, since a one-sequence prefill's mask is causal by
    construction. Anything else (another thread's forward, a batch, a GPU) is plain SDPA."""
    usable = _ACTIVE.on and query.device.type == "cpu" and _CPU_FLASH is not None
    usable = usable and query.shape[0] == 1
    if not usable or key.shape[2] < query.shape[2]:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = prefill_attention(query, key, value, scale)
    return out.transpose(1, 2).contiguous(), None


class _Active(threading.local):
    """Whether this thread runs a prefill forward (``active``): the model's config is shared
    by every thread, so another thread's forward (a trainer sharing the model) can reach
    ``attend`` meanwhile and must get SDPA."""

    on = False


_ACTIVE = _Active()

AttentionInterface.register(NAME, attend)
# Masks as for SDPA: the fallback above needs them.
AttentionMaskInterface.register(NAME, sdpa_mask)


@contextlib.contextmanager
def active(model: PreTrainedModel) -> Iterator[None]:
    """Run ``model``'s forwards in this block (in this thread) with ``attend``."""
    config = model.config
    before = config._attn_implementation
    _ACTIVE.on, config._attn_implementation = True, NAME
    try:
        yield
    finally:
        _ACTIVE.on, config._attn_implementation = False, before
