"""Shared-prompt ("cascade") decode attention for ``DecodeSession``.

Why. A GRPO group decodes G rows from one prompt, and every decode step reads every row's whole
context: with a plain per-row K/V slab, the prompt's K/V (hundreds of columns, 46 KB each for
SmolLM2-135M) is read G times per step, and a short row is padded to the longest row's width.
On a CPU that reading is the step's cost (memory bound). Here each distinct prompt's K/V is held
once, in a ``PromptSlab`` slot, and a row's own slab holds only what it generated; attention
runs once over the prompt slots (the queries of all rows sharing a slot side by side) and once
over the rows' own columns, and the two partial softmaxes are merged exactly through their
log-sum-exps (``merge_partials``), as in FlashInfer's cascade attention.

How it plugs in. ``attend`` is registered with transformers' ``AttentionInterface`` under
``NAME``; ``active`` switches the model to it for one decode forward and back. Any other forward
(a prefill: ``prefill.py``; the trainer) does not use it.

Numerics: the merge is exact algebra; results differ from single-pass attention by float
rounding only (tests compare against SDPA over the concatenated K/V).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

if TYPE_CHECKING:
    from transformers import PreTrainedModel

NAME = "envace_cascade"
# torch's fused CPU attention kernel, which also returns the log-sum-exp (a private op, so the
# plain-matmul path stands in if a torch build lacks it).
_CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
FEW_KEYS = 96  # up to this many keys, ``few_keys_attention`` beats the flash kernel on a CPU
GROW_MARGIN = 256  # extra prompt columns when the prompt slab widens: fewer re-allocations


def attention_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention and its log-sum-exp: ``([B, H, Lq, D], [B, H, Lq])``.

    ``mask`` is additive (0 or -inf), broadcast to ``[B, H, Lq, Lk]``; ``k``/``v`` have as many
    heads as ``q``. On a CPU this is torch's fused flash kernel (which returns the log-sum-exp);
    elsewhere plain matmuls (``_CPU_FLASH = None`` forces them, as the tests do).
    """
    if q.device.type == "cpu" and _CPU_FLASH is not None:
        out, lse = _CPU_FLASH(q, k, v, 0.0, False, attn_mask=mask, scale=scale)
        return out, lse
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores + mask
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - lse[..., None]), v), lse


def few_keys_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``attention_with_lse`` for the rows' own columns of a decode step: ``q`` ``[B, H, G,
    D]``, ``k``/``v`` ``[B, H, W, D]`` (views of a slab whose ``B`` and ``H`` dims merge), an
    additive ``mask`` broadcast to ``[B, H, G, W]`` that leaves every query at least one key.

    Why. At a few dozen keys the fused CPU flash kernel's fixed cost per (row, head) dominates,
    and three batched matrix products are faster; by 200 keys the two are even
    (``bench/decode_step.py``'s ``own_attention_us`` times both), hence ``FEW_KEYS``.
    """
    b, h, g, d = q.shape
    w = k.shape[-2]
    bias = mask.expand(b, h, g, w).reshape(b * h, g, w)
    keys, values = k.reshape(b * h, w, d), v.reshape(b * h, w, d)
    scores = torch.baddbmm(bias, q.reshape(b * h, g, d), keys.transpose(1, 2), alpha=scale)
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    out = torch.bmm(scores.sub_(lse).exp_(), values)
    return out.view(b, h, g, d), lse.view(b, h, g)


def merge_partials(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention (and its log-sum-exp) over keys A ∪ B from attention over A and over B alone.

    With ``lse`` the log of each part's softmax denominator, the full softmax weighs part B's
    output by ``exp(lse_b) / (exp(lse_a) + exp(lse_b)) = sigmoid(lse_b - lse_a)``, and the
    union's log-sum-exp is ``logaddexp(lse_a, lse_b)``: four kernels per merge (a decode step
    runs two merges per layer), each stable for any finite or -inf ``lse``. A part B with
    ``lse_b = -inf`` gets weight exactly 0, which leaves part A exactly as it was.
    """
    weight = torch.sigmoid(lse_b - lse_a)
    return torch.lerp(out_a, out_b, weight[..., None]), torch.logaddexp(lse_a, lse_b)


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Length of the longest common prefix (binary search over C-level slice comparisons)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class _Plan:
    """Per-step index tensors of a ``PromptSlab`` (rebuilt only when rows join or leave).

    ``gather[p, r]`` is the batch row of slot ``p``'s ``r``-th member (0 as filler); ``pos[j]``
    is row ``j``'s place ``p * width + r`` in the gathered queries; ``outsider[j]`` says that
    row ``j`` does not use this slab; ``mask`` lets each query see only its row's columns of
    the slot.
    """

    slots: int
    columns: int
    mask: torch.Tensor  # [slots, 1, width * g, columns] additive
    gather: torch.Tensor  # [slots, width]
    pos: torch.Tensor  # [rows]
    outsider: torch.Tensor | None  # [rows, 1, 1] bool: rows not using this slab (None: none)


class PromptSlab:
    """Prompt K/V shared by a session's rows, one slot per held token sequence.

    A row attends to the first ``length`` columns of one slot: the rows of a GRPO group use the
    whole of one prompt, and a row whose prompt begins like a held one uses that much of it.
    Per layer a ``[slots, kv_heads, capacity, head_dim]`` tensor; slot ``p`` holds its tokens'
    K/V in columns ``[0, len)``. Held slots are kept contiguous from 0 (attention reads every
    slot below the last held one). A slot's columns past its tokens are zeroed when it is
    placed, so every column attention reads is finite (masked weights are 0, and 0 times a
    finite value is 0).
    """

    def __init__(
        self, n_layers: int, slots: int, kv_heads: int, head_dim: int, like: torch.Tensor
    ) -> None:
        self.n_layers, self.kv_heads, self.head_dim = n_layers, kv_heads, head_dim
        self.like = like
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.keys: list[Hashable | None] = [None] * slots
        self.tokens: list[tuple[int, ...]] = [()] * slots
        self.members: list[dict[int, int]] = [{} for _ in range(slots)]  # row -> its length
        self.slot_of: dict[int, int] = {}  # batch row -> the slot it uses
        self.by_key: dict[Hashable, int] = {}
        self._plan: _Plan | None = None
        self._shape = (0, 0)

    def tensors(self) -> list[torch.Tensor]:
        """The per-layer slabs (for ``kv.storage_bytes``)."""
        return [*self.k, *self.v]

    @property
    def held(self) -> int:
        """Slots in use (they are ``[0, held)``)."""
        return len(self.by_key)

    def find(self, key: Hashable) -> int | None:
        """The slot placed under ``key``, if it is still held."""
        return self.by_key.get(key)

    def longest(self, tokens: tuple[int, ...]) -> tuple[int | None, int]:
        """``(slot, n)``: the held slot sharing the longest prefix with ``tokens``, and how long."""
        best, best_n = None, 0
        for slot in range(self.held):
            n = common_prefix(self.tokens[slot], tokens)
            if n > best_n:
                best, best_n = slot, n
        return best, best_n

    def place(self, key: Hashable, tokens: tuple[int, ...], kv: torch.Tensor) -> int:
        """Copy K/V of ``tokens`` (``[layers, 2, kv_heads, len, head_dim]``) into a new slot."""
        slot, n = self.held, len(tokens)
        self._reserve(slot + 1, n)
        for i in range(self.n_layers):
            for store, part in ((self.k, kv[i, 0]), (self.v, kv[i, 1])):
                store[i][slot, :, :n] = part
                store[i][slot, :, n:] = 0  # padding another row's mask hides: keep it finite
        self.keys[slot], self.tokens[slot] = key, tokens
        self.by_key[key] = slot
        return slot

    def join(self, row: int, slot: int, length: int) -> None:
        """Batch row ``row`` attends to the first ``length`` columns of ``slot``."""
        self.members[slot][row] = length
        self.slot_of[row] = slot
        self._plan = None

    def move(self, row: int, to: int) -> None:
        """Batch row ``row`` is now batch row ``to`` (same slot, same length)."""
        slot = self.slot_of.pop(row, None)
        if slot is not None:
            self.members[slot][to] = self.members[slot].pop(row)
            self.slot_of[to] = slot
            self._plan = None

    def leave(self, row: int) -> None:
        """Row ``row`` finished; a slot no row uses any more is freed."""
        slot = self.slot_of.pop(row, None)
        if slot is None:
            return
        del self.members[slot][row]
        if not self.members[slot]:
            del self.by_key[self.keys[slot]]
            self.keys[slot], self.tokens[slot] = None, ()
            self._fill_hole(slot)
        self._plan = None

    def _fill_hole(self, hole: int) -> None:
        """Move the last held slot into the freed ``hole``, so held slots stay ``[0, held)``."""
        last = self.held  # the slots were [0, held + 1) before ``hole`` was freed
        if last == hole:
            return
        n = len(self.tokens[last])
        for store in (self.k, self.v):
            for layer in store:
                layer[hole, :, :n] = layer[last, :, :n]
        key = self.keys[last]
        self.keys[hole], self.tokens[hole] = key, self.tokens[last]
        self.keys[last], self.tokens[last] = None, ()
        self.by_key[key] = hole
        self.members[hole], self.members[last] = self.members[last], {}
        for row in self.members[hole]:
            self.slot_of[row] = hole

    def row_kv(self, layer: int, row: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The columns row ``row`` uses in ``layer`` (``[kv_heads, length, head_dim]`` views)."""
        slot = self.slot_of.get(row)
        if slot is None:
            return None
        n = self.members[slot][row]
        return self.k[layer][slot, :, :n], self.v[layer][slot, :, :n]

    def plan(self, rows: int, g: int) -> _Plan:
        """The index tensors for a forward over batch rows ``[0, rows)``, ``g`` query heads per
        K/V head."""
        if self._plan is None or self._shape != (rows, g):
            self._plan, self._shape = self._build(rows, g), (rows, g)
        return self._plan

    def _build(self, rows: int, g: int) -> _Plan:
        slots = self.held
        columns = max((len(self.tokens[p]) for p in range(slots)), default=0)
        width = max((len(self.members[p]) for p in range(slots)), default=1)
        gather = torch.zeros((slots, width), dtype=torch.long)
        lengths = torch.zeros((slots, width), dtype=torch.long)
        pos = torch.zeros(rows, dtype=torch.long)
        member = torch.zeros((rows, 1, 1), dtype=torch.bool)
        for p in range(slots):
            for r, (row, n) in enumerate(self.members[p].items()):
                gather[p, r], lengths[p, r] = row, n
                pos[row] = p * width + r
                member[row] = True
        seen = torch.arange(columns) < lengths.repeat_interleave(g, dim=1)[..., None]
        mask = torch.zeros(seen.shape, dtype=self.like.dtype).masked_fill(~seen, float("-inf"))
        device = self.like.device
        return _Plan(
            slots,
            columns,
            mask[:, None].to(device),
            gather.to(device),
            pos.to(device),
            None if bool(member.all()) else (~member).to(device),
        )

    def _reserve(self, slots: int, columns: int) -> None:
        """Room for ``slots`` slots of ``columns`` columns; held slots are kept.

        Grown geometrically in slots and with a margin in columns, uninitialised: a slot's
        columns are all written (K/V, then zeros) when it is placed, and a held slot's new
        columns are zeroed here, so every column attention can read is finite.
        """
        have_slots, have_columns = self.k[0].shape[:3:2] if self.k else (0, 0)
        if slots <= have_slots and columns <= have_columns:
            return
        slots = max(slots, min(2 * have_slots, len(self.keys)), 4)
        columns = max(columns + GROW_MARGIN, have_columns)
        held = self.held
        for store in (self.k, self.v):
            for i in range(self.n_layers):
                new = self.like.new_empty(slots, self.kv_heads, columns, self.head_dim)
                if held:
                    new[:held, :, :have_columns] = store[i][:held]
                    new[:held, :, have_columns:] = 0
                if i < len(store):
                    store[i] = new
                else:
                    store.append(new)

    def attend(
        self, layer: int, q: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Merge this slab's part into attention computed so far over other keys.

        ``q`` is ``[B, kv_heads, g, D]``; ``out``/``lse`` are the attention and log-sum-exp so
        far. Returns them over the union of those keys and this slab's columns of each row.
        """
        _, kv_heads, g, dim = q.shape
        plan = self.plan(q.shape[0], g)
        if not plan.slots:
            return out, lse
        width = plan.gather.shape[1]
        # The queries of a slot's rows side by side: [slots, kv_heads, width * g, D].
        queries = q[plan.gather.view(-1)].view(plan.slots, width, kv_heads, g, dim)
        queries = queries.transpose(1, 2).reshape(plan.slots, kv_heads, width * g, dim)
        keys = self.k[layer][: plan.slots, :, : plan.columns]
        values = self.v[layer][: plan.slots, :, : plan.columns]
        p_out, p_lse = attention_with_lse(queries, keys, values, plan.mask, scale)
        p_out = p_out.view(plan.slots, kv_heads, width, g, dim).transpose(1, 2)
        p_out = p_out.reshape(plan.slots * width, kv_heads, g, dim)[plan.pos]
        p_lse = p_lse.view(plan.slots, kv_heads, width, g).transpose(1, 2)
        p_lse = p_lse.reshape(plan.slots * width, kv_heads, g)[plan.pos]
        if plan.outsider is not None:  # their part gets weight 0: they keep ``out`` exactly
            p_lse = p_lse.masked_fill(plan.outsider, float("-inf"))
        return merge_partials(out, lse, p_out, p_lse)


class _Active(threading.local):
    """The slabs of the decode forward running in this thread (none outside ``active``).

    Per thread: a process may run several samplers at once (loopback servers in tests, one per
    thread), each with its own model and slabs.
    """

    slabs: tuple[PromptSlab, ...] = ()


_ACTIVE = _Active()


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
    """transformers attention function: a decode step over the active ``PromptSlab`` + rows.

    ``key``/``value`` are the rows' own columns (the session's ``SlabLayer``s) and
    ``attention_mask`` their additive ``[B, 1, 1, W]`` mask. Anything else (no active slab, or
    more than one query position) is plain SDPA.
    """
    slabs = _ACTIVE.slabs
    if not slabs or query.shape[2] != 1:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    rows, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    scale = scaling if scaling is not None else dim**-0.5
    # A decode step's query heads sharing a K/V head become query positions (GQA, no copy).
    q = query.reshape(rows, kv_heads, heads // kv_heads, dim)
    # A plain int attribute of the attention module; torch types Module.__getattr__ as
    # returning a Tensor or Module (parameters, buffers, submodules).
    layer_idx = cast(int, module.layer_idx)
    out = decode_attention(q, key, value, attention_mask, slabs, layer_idx, scale)
    return out.reshape(rows, heads, 1, dim).transpose(1, 2).contiguous(), None


def decode_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None,
    slabs: Sequence[PromptSlab],
    layer: int,
    scale: float,
) -> torch.Tensor:
    """One decode step's attention of ``q`` (``[rows, kv_heads, g, D]``: the ``g`` query heads
    of each K/V head as query positions) over each row's own columns (``keys``/``values``,
    ``[rows, kv_heads, W, D]``, additive ``mask`` ``[rows, 1, 1, W]``) and its columns of each
    prompt slab of ``layer``, merged exactly (``merge_partials``): ``[rows, kv_heads, g, D]``."""
    if q.device.type == "cpu" and keys.shape[-2] <= FEW_KEYS and mask is not None:
        out, lse = few_keys_attention(q, keys, values, mask, scale)
    else:
        out, lse = attention_with_lse(q, keys, values, mask, scale)
    for slab in slabs:
        out, lse = slab.attend(layer, q, out, lse, scale)
    return out


AttentionInterface.register(NAME, attend)
# Masks as for SDPA: a forward of the same model in another thread while ``active`` holds (a
# trainer sharing the model) gets SDPA's masks, and ``attend`` falls back to SDPA for it.
AttentionMaskInterface.register(NAME, sdpa_mask)


@contextlib.contextmanager
def active(model: PreTrainedModel, slabs: tuple[PromptSlab, ...]) -> Iterator[None]:
    """Run ``model``'s forwards in this block (in this thread) with ``attend`` over ``slabs``."""
    config = model.config
    before = config._attn_implementation
    _ACTIVE.slabs, config._attn_implementation = slabs, NAME
    try:
        yield
    finally:
        _ACTIVE.slabs, config._attn_implementation = (), before
