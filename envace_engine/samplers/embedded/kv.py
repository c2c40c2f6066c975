"""KV-cache plumbing for ``HFSampler``: a preallocated cache layer and a cross-call prefix cache.

Why this exists. On a CPU the prefill of a long prompt costs as much compute as hundreds of
decode rows (every prompt token goes through every weight), and a rollout re-sends each
episode's whole history at every micro-step: the act prompt of turn k extends the sequence the
sampler produced at turn k-1, and every rehearse prompt of a world starts with the same system
message and worked examples. SGLang keeps those KV states in its radix cache; ``PrefixCache``
does the same for the embedded model, so a micro-step only prefills the tokens that are new.

* ``SlabLayer`` — a transformers cache layer that writes into a preallocated
  ``[batch, kv_heads, capacity, head_dim]`` slab instead of ``torch.cat``-ing the whole cache at
  every decode step (``DynamicLayer`` copies O(context) bytes per token per layer).
* ``PrefixCache`` — an LRU store of the K/V of recently generated sequences, indexed by chained
  hashes of fixed-size token blocks (vLLM/SGLang style), so finding the longest cached prefix of
  a prompt costs O(prompt length). Entries are exact: a hit is verified token by token.

Numerics: a cached K/V was computed in some earlier batch (other rows, other padding), so a
resumed prompt's logits can differ from a fresh prefill in the last bits, as in any batched
serving engine. The sampled ids and the log-probs returned for them are what the trainer uses.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, DynamicLayer

BLOCK = 16  # tokens per hashed block: lookups walk blocks, then extend token by token


class SlabLayer(DynamicLayer):
    """One layer's K/V in a preallocated slab; ``keys``/``values`` are views of the filled part.

    The slab is ``[batch, kv_heads, capacity, head_dim]``; the filled part is columns
    ``[begin, end)``. Appending writes after ``end``; ``drop_left`` moves ``begin`` right (a
    view). Every column of the slab is always finite (allocations are zeroed, and only K/V is
    written), so a padding column left over from an earlier row is harmless behind the mask:
    its weight is exactly 0, and 0 times a finite value is 0.
    """

    keys: torch.Tensor  # never None here: set from the slab in __init__ (``_refresh``)
    values: torch.Tensor

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        super().__init__()
        self._k, self._v = keys, values
        self.begin, self.end = 0, length
        self.rows = keys.shape[0]  # the forward runs on rows [0, rows) (a view, no copy)
        self.device = keys.device
        self.is_initialized = True
        self._refresh()

    @property
    def length(self) -> int:
        """Filled columns."""
        return self.end - self.begin

    def _refresh(self) -> None:
        self.keys = self._k[: self.rows, :, self.begin : self.end]
        self.values = self._v[: self.rows, :, self.begin : self.end]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new positions after the filled part (making room if the slab is full)."""
        n = key_states.shape[-2]
        if self.end + n > self._k.shape[-2]:
            self._reserve(self.length + n)
        self._k[: self.rows, :, self.end : self.end + n] = key_states
        self._v[: self.rows, :, self.end : self.end + n] = value_states
        self.end += n
        self._refresh()
        return self.keys, self.values

    def _reserve(self, needed: int) -> None:
        """Move the filled part to column 0 of a slab with room for ``needed`` columns.

        The same slab when it is wide enough (the filled part slid left), else one twice as wide
        (or ``needed``, when that is more).
        """
        capacity = self._k.shape[-2]
        if needed > capacity:
            capacity = max(needed, 2 * capacity)
        length = self.length
        for name in ("_k", "_v"):
            old = getattr(self, name)
            live = old[:, :, self.begin : self.end]
            if capacity == old.shape[-2]:
                old[:, :, :length] = live.clone()  # overlapping ranges: copy through a buffer
            else:
                new = old.new_zeros(*old.shape[:2], capacity, old.shape[-1])
                new[:, :, :length] = live
                setattr(self, name, new)
        self.begin, self.end = 0, length

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The slabs this layer holds (for ``storage_bytes``)."""
        return self._k, self._v

    def drop_left(self, n: int) -> None:
        """Forget the first ``n`` filled columns (no copy)."""
        self.begin += n
        self._refresh()

    def move_row(self, src: int, dst: int) -> None:
        """Copy row ``src``'s filled columns into row ``dst``."""
        for store in (self._k, self._v):
            store[dst, :, self.begin : self.end] = store[src, :, self.begin : self.end]

    def row(self, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row ``j``'s filled columns, ``([kv_heads, length, head_dim], ...)``, as views."""
        return self._k[j, :, self.begin : self.end], self._v[j, :, self.begin : self.end]

    def get_seq_length(self) -> int:
        """Filled positions (padding included: the attention mask hides it)."""
        return self.length

    def get_max_length(self) -> int:
        """No fixed maximum: the slab grows."""
        return -1

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the rows in ``indices`` (finished rows leave the batch)."""
        self._k, self._v = self._k[indices], self._v[indices]
        self.rows = self._k.shape[0]
        self._refresh()

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat every row ``repeats`` times."""
        self._k = self._k.repeat_interleave(repeats, dim=0)
        self._v = self._v.repeat_interleave(repeats, dim=0)
        self.rows = self._k.shape[0]
        self._refresh()


def slab_cache(
    n_layers: int, batch: int, kv_heads: int, head_dim: int, capacity: int, like: torch.Tensor
) -> Cache:
    """An empty cache of ``SlabLayer``s with room for ``capacity`` positions per row.

    Zeroed, so that every column is finite from the start (see ``SlabLayer``).
    """
    slabs = [like.new_zeros(batch, kv_heads, capacity, head_dim) for _ in range(n_layers)]
    return Cache(layers=[SlabLayer(k, torch.zeros_like(k), 0) for k in slabs])


@dataclass(frozen=True)
class Continuation:
    """K/V of a sequence given as the first ``split`` positions of an earlier entry, then
    ``own`` (``[layers, 2, H, n, D]``).

    A finished row's sequence is its prompt (already cached) plus what it generated: kept this
    way, finishing a row copies only the generated part, and the whole is joined on first use
    (most finished sequences are never continued: their episode ended).
    """

    parent: _Entry
    split: int
    own: torch.Tensor


class _Entry:
    """A cached sequence: the tokens whose K/V ``kv`` holds (``[layers, 2, H, len, D]``)."""

    def __init__(
        self,
        key: int,
        tokens: tuple[int, ...],
        kv: torch.Tensor | Continuation,
        hashes: tuple[int, ...],
    ) -> None:
        self.key, self.tokens, self.hashes = key, tokens, hashes
        self._kv = kv

    def tensors(self) -> Iterator[torch.Tensor]:
        """Every tensor this entry keeps alive (a ``Continuation``'s parent's too)."""
        if isinstance(self._kv, Continuation):
            yield from self._kv.parent.tensors()
            yield self._kv.own
        else:
            yield self._kv

    @property
    def kv(self) -> torch.Tensor:
        """The K/V, joined from a ``Continuation`` the first time it is asked for."""
        if isinstance(self._kv, Continuation):
            part = self._kv
            self._kv = torch.cat([part.parent.kv[:, :, :, : part.split], part.own], dim=3)
        return self._kv


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors``: views of one storage count once."""
    sizes = {}
    for t in tensors:
        storage = t.untyped_storage()
        sizes[storage.data_ptr()] = storage.nbytes()
    return sum(sizes.values())


def block_hashes(tokens: Sequence[int]) -> list[int]:
    """Chained hashes of every full ``BLOCK``: ``h[j]`` identifies ``tokens[: (j + 1) * BLOCK]``."""
    out, h = [], 0
    for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
        h = hash((h, tuple(tokens[start : start + BLOCK])))
        out.append(h)
    return out


class PrefixCache:
    """LRU store of K/V by token prefix; ``max_tokens`` bounds what is kept between calls.

    Nothing is evicted during a call (``end_call`` evicts), so the shared prefixes of a batch
    stay available to all of its chunks; ``max_tokens=0`` therefore means "share prefixes within
    one call only". Several entries may hold the same leading blocks (every rehearse prompt of a
    world starts alike): ``holders`` maps each block hash to all of them, so dropping one entry
    never hides a prefix that another still holds.
    """

    def __init__(self, max_tokens: int) -> None:
        if max_tokens < 0:
            raise ValueError(f"max_tokens={max_tokens}: use 0 (no reuse across calls) or more")
        self.max_tokens = max_tokens
        self.entries: OrderedDict[int, _Entry] = OrderedDict()
        self.holders: dict[int, set[int]] = {}  # block hash -> keys of the entries holding it
        self.tokens = 0
        self._next_key = 0
        self.hits = 0  # prompt tokens served from the cache (for metrics and tests)

    def lookup(self, prompt: Sequence[int]) -> tuple[_Entry | None, int]:
        """Longest cached prefix of ``prompt``, capped so one prompt token is left to compute."""
        limit = len(prompt) - 1
        deepest: set[int] = set()
        depth = 0
        for j, h in enumerate(block_hashes(prompt[:limit])):
            keys = self.holders.get(h)
            if not keys:
                break
            deepest, depth = keys, (j + 1) * BLOCK
        if not deepest:
            return None, 0
        # All hold the same first ``depth`` tokens; the one going on furthest with the prompt
        # wins (the newest on a tie): prompts prefilled together share their first blocks.
        best: tuple[_Entry | None, int] = (None, 0)
        head = tuple(prompt[:depth])
        for key in sorted(deepest, reverse=True):
            entry = self.entries[key]
            if entry.tokens[:depth] != head:  # hash collision: a miss
                continue
            n, stop = depth, min(limit, len(entry.tokens))
            while n < stop and entry.tokens[n] == prompt[n]:
                n += 1
            if n > best[1]:
                best = (entry, n)
        return best

    def use(self, entry: _Entry, n: int) -> None:
        """Record a hit of ``n`` tokens on ``entry`` (most recently used)."""
        self.entries.move_to_end(entry.key)
        self.hits += n

    def insert(self, tokens: Sequence[int], kv: torch.Tensor | Continuation) -> None:
        """Keep ``kv`` for ``tokens``; an older entry that is a prefix of it is dropped.

        A ``Continuation`` keeps its parent's tensor alive (not counted again in ``tokens``)
        until it is joined or dropped.
        """
        tokens = tuple(tokens)
        if len(tokens) < BLOCK:
            return
        older, n = self.lookup((*tokens, -1))
        if older is not None and n == len(tokens):
            self.entries.move_to_end(older.key)  # already held in full
            return
        if older is not None and n == len(older.tokens):
            self._drop(older.key)  # superseded: its sequence went on (the next turn)
        key, self._next_key = self._next_key, self._next_key + 1
        hashes = tuple(block_hashes(tokens))
        self.entries[key] = _Entry(key, tokens, kv, hashes)
        for h in hashes:
            self.holders.setdefault(h, set()).add(key)
        self.tokens += len(tokens)

    def tensors(self) -> Iterator[torch.Tensor]:
        """Every tensor the entries keep alive (for ``storage_bytes``)."""
        for entry in self.entries.values():
            yield from entry.tensors()

    def end_call(self) -> None:
        """Evict least recently used entries down to ``max_tokens``."""
        self.evict(self.max_tokens)

    def evict(self, limit: int) -> None:
        """Drop least recently used entries until at most ``limit`` tokens are held."""
        while self.tokens > limit and self.entries:
            self._drop(next(iter(self.entries)))

    def _drop(self, key: int) -> None:
        entry = self.entries.pop(key)
        self.tokens -= len(entry.tokens)
        for h in entry.hashes:
            keys = self.holders[h]
            keys.discard(key)
            if not keys:
                del self.holders[h]
