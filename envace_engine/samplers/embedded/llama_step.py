"""A compact decode step for Llama-architecture models (the embedded sampler's hot loop).

Why. A decode step feeds one token per row through every layer, so its tensors are tiny
(``[rows, 576]`` for SmolLM2-135M) and its cost is the number of operations, not their size:
profiled (docs/samplers.md, "Where the time goes"), a rollout's time went to ~15 k profiler
events per forward — transformers' per-module machinery (kwarg shims, output capturing, mask
creation, the attention-interface lookup, ``Cache.update`` dispatch), the packed linears' input
and output casts, the cascade merges — more than to the GEMMs' arithmetic. This module runs
the same math as ``LlamaForCausalLM.forward`` for one new token per row as one plain function
over the layers, calling the packed GEMMs (``packed.PackedGemm``) and the cascade attention
(``cascade.decode_attention``) directly.

Numerics. With fp32 GEMMs it is transformers' forward up to float rounding (the tests compare
generations and log-probs). With bf16 GEMMs it computes the GEMMs as the trainer does under bf16
autocast (``training/``): each GEMM's input is cast to bf16 once and its output stays bf16
until it meets fp32 — rotary embedding, the residual stream and norms stay fp32 — and the
MLP's ``silu(gate) * up`` runs in bf16, as autocast runs it; so do the LM head's logits, as
the trainer's (``logprobs._tile``), before the fp32 softmax. Attention stays fp32 (the
trainer's runs in bf16 under CPU autocast).

Prefill (``prefill``). The prompts a decode session admits at once are prefilled in one pass:
their new tokens side by side as the rows of every GEMM, each prompt's attention over its own
cached prefix and its new tokens (``prefill.prefill_attention``). Through transformers each
prompt was one forward with its own fixed cost (~30 ms for SmolLM2-135M on a 2-core CPU,
most of a 30-token prefill, and a rollout's prompts grow by a tool answer of a few dozen tokens
per turn); here that cost is paid once per batch, and the GEMMs see more rows. No LM head: a
prefill keeps only K/V (the last prompt token runs in the decode step).

Every other forward goes through transformers. Models this does not cover (``unsupported``)
decode and prefill through transformers too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache
from transformers.models.llama.modeling_llama import (
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaRMSNorm,
)

from envace_engine.samplers.embedded import cascade
from envace_engine.samplers.embedded.cascade import PromptSlab
from envace_engine.samplers.embedded.kv import SlabLayer
from envace_engine.samplers.embedded.packed import PackedGemm, PackedLinears
from envace_engine.samplers.embedded.prefill import prefill_attention


def unsupported(model: torch.nn.Module, packed: PackedLinears) -> str | None:
    """Why the compact step cannot run ``model`` (None when it can)."""
    if not isinstance(model, LlamaForCausalLM):  # SmolLM2 and the ``tiny`` test model
        return f"{type(model).__name__} is not a LlamaForCausalLM"
    config = model.config
    if config.hidden_act != "silu":
        return f"activation {config.hidden_act!r} (the step implements silu)"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "pretraining_tp != 1"
    if not packed.enabled:
        return "the packed oneDNN path is off (CUDA, DTensor, or packed_weights=False)"
    return None


@dataclass(frozen=True)
class _Layer:
    """One decoder layer's pieces: its norms (weights read at each step) and packed GEMMs."""

    norm_in: LlamaRMSNorm
    norm_post: LlamaRMSNorm
    qkv: PackedGemm
    o: PackedGemm
    gate_up: PackedGemm
    down: PackedGemm


@dataclass(frozen=True)
class Segment:
    """One prompt of a batched prefill: its K/V buffer ``[layers, 2, kv_heads, held + n, D]``
    (columns ``< held`` already filled from the prefix cache; ``prefill`` writes the rest) and
    its ``n`` new tokens."""

    kv: torch.Tensor
    held: int
    tokens: tuple[int, ...]


class LlamaDecodeStep:
    """``__call__`` = one decode step's logits, ``[rows, vocab]`` fp32 (see module doc)."""

    def __init__(self, model: LlamaForCausalLM, packed: PackedLinears) -> None:
        reason = unsupported(model, packed)
        if reason is not None:
            raise ValueError(f"compact decode step: {reason}")
        self.inner = model.model  # modules, not weights: a replaced Parameter is seen
        attn = cast(LlamaDecoderLayer, self.inner.layers[0]).self_attn  # the model's geometry
        self.heads = model.config.num_attention_heads
        self.kv_heads = self.heads // attn.num_key_value_groups
        self.head_dim, self.scale = attn.head_dim, attn.scaling
        self.packed = packed
        self.head = packed.pack_of(model.lm_head)
        self.layers = [self._layer(cast(LlamaDecoderLayer, la)) for la in self.inner.layers]

    def _layer(self, layer: LlamaDecoderLayer) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        return _Layer(
            norm_in=layer.input_layernorm,
            norm_post=layer.post_attention_layernorm,
            qkv=self.packed.pack_of(attn.q_proj, (attn.q_proj, attn.k_proj, attn.v_proj)),
            o=self.packed.pack_of(attn.o_proj),
            gate_up=self.packed.pack_of(mlp.gate_proj, (mlp.gate_proj, mlp.up_proj)),
            down=self.packed.pack_of(mlp.down_proj),
        )

    @torch.inference_mode()
    def __call__(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: Cache,
        slabs: Sequence[PromptSlab],
    ) -> torch.Tensor:
        """Logits of one step: ``input_ids``/``position_ids`` ``[rows]``, ``attention_mask`` the
        additive ``[rows, 1, 1, columns]`` mask of the rows' own columns in ``cache``."""
        self.packed.refresh()
        h, cos, sin = self._embed(input_ids, position_ids)
        for i, layer in enumerate(self.layers):
            h = self._attention(i, layer, h, cos, sin, attention_mask, cache, slabs)
            h = self._mlp(layer, h)
        return self.head.matmul(_rms_norm(h, self.inner.norm)).float()

    @torch.inference_mode()
    def prefill(self, segments: Sequence[Segment]) -> None:
        """Write the K/V of every segment's new tokens into its buffer, in one pass."""
        self.packed.refresh()
        ids = torch.tensor([t for seg in segments for t in seg.tokens])
        pos = torch.cat([torch.arange(s.held, s.held + len(s.tokens)) for s in segments])
        h, cos, sin = self._embed(ids, pos)
        for i, layer in enumerate(self.layers):
            h = self._prefill_attention(i, layer, h, cos, sin, segments)
            h = self._mlp(layer, h)

    def _embed(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The fp32 residual stream of ``[rows]`` tokens and their rotary ``cos``/``sin``
        (``[rows, 1, d]``, ``sin`` prepared for ``_qkv``)."""
        h = F.embedding(input_ids, self.inner.embed_tokens.weight)
        cos, sin = self.inner.rotary_emb(h[:, None], position_ids[:, None])
        half = self.head_dim // 2
        # rotate_half(x) * sin == roll(x, half) * (sin with its first half negated)
        return h, cos, torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)

    def _qkv(
        self, layer: _Layer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A layer's rotated q and k heads (``[rows, heads + kv_heads, d]``, q first, fp32)
        and its v heads (``[rows, kv_heads, d]``, in the GEMM's dtype)."""
        rows, d = h.shape[0], self.head_dim
        qkv = layer.qkv.matmul(_rms_norm(h, layer.norm_in))
        rotated = self.heads + self.kv_heads
        qk = qkv[:, : rotated * d].view(rows, rotated, d)
        qk = torch.addcmul(qk * cos, qk.roll(d // 2, dims=-1), sin)  # fp32 from here
        return qk, qkv[:, rotated * d :].view(rows, self.kv_heads, d)

    def _prefill_attention(
        self,
        i: int,
        layer: _Layer,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        segments: Sequence[Segment],
    ) -> torch.Tensor:
        rows, d = h.shape[0], self.head_dim
        qk, v = self._qkv(layer, h, cos, sin)
        out = h.new_empty(rows, self.heads, d)
        start = 0
        for seg in segments:
            stop = start + len(seg.tokens)
            keys, values = seg.kv[i, 0], seg.kv[i, 1]  # [kv_heads, held + n, d]
            keys[:, seg.held :] = qk[start:stop, self.heads :].transpose(0, 1)
            values[:, seg.held :] = v[start:stop].transpose(0, 1)
            q = qk[start:stop, : self.heads].transpose(0, 1)[None]  # [1, heads, n, d]
            part = prefill_attention(q, keys[None], values[None], self.scale)
            out[start:stop] = part[0].transpose(0, 1)
            start = stop
        return h + layer.o.matmul(out.view(rows, self.heads * d))

    def _attention(
        self,
        i: int,
        layer: _Layer,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        cache: Cache,
        slabs: Sequence[PromptSlab],
    ) -> torch.Tensor:
        rows, d = h.shape[0], self.head_dim
        qk, v = self._qkv(layer, h, cos, sin)
        g = self.heads // self.kv_heads
        q = qk[:, : self.heads].view(rows, self.kv_heads, g, d)  # GQA: heads as query rows
        k = qk[:, self.heads :, None]  # [rows, kv_heads, 1, d]
        keys, values = cast(SlabLayer, cache.layers[i]).update(k, v[:, :, None])  # the slabs
        out = cascade.decode_attention(q, keys, values, mask, slabs, i, self.scale)
        return h + layer.o.matmul(out.view(rows, self.heads * d))

    def _mlp(self, layer: _Layer, h: torch.Tensor) -> torch.Tensor:
        gate, up = layer.gate_up.matmul(_rms_norm(h, layer.norm_post)).chunk(2, dim=-1)
        return h + layer.down.matmul(F.silu(gate) * up)


def _rms_norm(h: torch.Tensor, norm: LlamaRMSNorm) -> torch.Tensor:
    """transformers' ``LlamaRMSNorm`` of an fp32 input (the same operations, so the same
    rounding; ``F.rms_norm`` on a CPU decomposes into more of them)."""
    eps = norm.variance_epsilon
    return norm.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps))
