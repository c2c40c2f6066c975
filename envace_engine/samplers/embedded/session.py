"""Continuous batching for ``HFSampler``: requests join and leave one running decode batch.

A micro-step batch shrinks as its rows finish, and the rows that finished wait for the slowest
one before their episode can go on (parse the call, build the rehearse prompt, generate again).
A ``DecodeSession`` instead admits a request as soon as a slot is free, between two decode
steps, so an episode's rehearsal starts decoding beside the other episodes' replies, as in
SGLang's scheduler. ``HFSampler.generate`` is a session whose requests are all submitted up
front; the rollout submits each episode's next request when its last one finishes.

Layout. A row's prompt (every token but the last) sits in a ``cascade.PromptSlab`` slot, once
per distinct prompt: the rows of a GRPO group share one copy, and decode attention reads it
once for all of them (``cascade``). The row's own columns, in one ``kv.SlabLayer`` per layer
(``[slots, kv_heads, columns, head_dim]``), hold only what the row fed since it joined: its
last prompt token, whose logits give its first sample, then each sampled token. All rows write
the same column each step; a row's columns start where it joined, behind masked padding, and
its position ids continue its prompt's. The forward runs on slots ``[0, k)`` (a view, no copy),
where ``k`` is one past the highest busy slot; free slots inside that range decode a dummy
token whose output is ignored.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from transformers.cache_utils import Cache

from envace_engine.samplers.base import Generation, SamplingParams
from envace_engine.samplers.embedded.cascade import PromptSlab
from envace_engine.samplers.embedded.kv import Continuation, SlabLayer, slab_cache
from envace_engine.samplers.embedded.sampling import pick_tokens

TRIM_AT = 64  # drop unused leading columns once there are this many
FIRST_COLUMNS = 64  # the rows' own slab starts this wide (zeroed) and doubles when full
# A prompt that begins like a held sequence uses it when they share at least MIN_SHARED tokens
# and at most MAX_REST of the prompt are left: a longer rest would widen every rest slot.
MIN_SHARED = 64
MAX_REST = 256


@dataclass(frozen=True)
class KVShape:
    """The K/V geometry of a model: layers, K/V heads, head size, and where K/V tensors live."""

    n_layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device

    def like(self) -> torch.Tensor:
        """An empty tensor of the K/V dtype and device (what slabs allocate ``like``)."""
        return torch.empty(0, dtype=self.dtype, device=self.device)


class DecodeModel(Protocol):
    """The model side of a session: its K/V shape, stop ids, one decode forward, finishing."""

    @property
    def kv_shape(self) -> KVShape:
        """Layers, heads and head size of the K/V the session allocates."""
        ...

    @property
    def stop_ids(self) -> frozenset[int]:
        """End-of-sequence ids every request stops at (besides its own)."""
        ...

    def decode_logits(
        self,
        slabs: tuple[PromptSlab, ...],
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: Cache,
    ) -> torch.Tensor:
        """One decode step's fp32 logits ``[rows, vocab]`` for one new token per row
        (``input_ids``/``position_ids`` ``[rows]``), attention reading the prompt ``slabs`` and
        the rows' own columns in ``cache`` behind the additive ``attention_mask``."""
        ...

    def finish(self, ids: list[int], logprobs: list[float], reason: str) -> Generation:
        """The finished ``Generation`` of a request (decodes its text)."""
        ...


class PromptCache(Protocol):
    """Where a session gets prompt K/V and leaves finished sequences (the prefix cache)."""

    @property
    def keeps_sequences(self) -> bool:
        """Whether finished sequences are kept (``remember``); else the session skips them."""
        ...

    def share_prefixes(self, prompts: list[list[int]]) -> None:
        """Prefill once each prefix that neighbouring (sorted) prompts share."""
        ...

    def prefill_many(self, prompts: list[list[int]]) -> None:
        """Put the K/V of every prompt in the cache, in as few forward passes as it can."""
        ...

    def prefix_kv(self, tokens: list[int]) -> torch.Tensor | None:
        """K/V of ``tokens``, ``[layers, 2, H, len, D]``: cached, or computed and kept."""
        ...

    def cached_entry(self, tokens: list[int]) -> Any:
        """The cache entry holding all of ``tokens`` now, or None."""
        ...

    def remember(self, tokens: list[int], kv: torch.Tensor | Continuation) -> None:
        """Keep a finished sequence's K/V for later prompts."""
        ...

    def count_prefilled(self, n: int) -> None:
        """Count ``n`` prompt tokens run through the model outside ``prefix_kv``."""
        ...


@dataclass
class _Request:
    """One generation being decoded (or waiting for a slot)."""

    key: Hashable
    prompt: list[int]
    cap: int
    stops: frozenset[int]
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class DecodeSession:
    """Requests in, finished generations out, one decode step at a time (see module doc)."""

    def __init__(
        self, model: DecodeModel, prompts: PromptCache, params: SamplingParams, slots: int
    ) -> None:
        self.m, self.p = model, prompts
        self.params = params  # temperature, top-k, top-p and seed; caps and stops per request
        shape = model.kv_shape
        self.shape = shape
        device = shape.device
        self.generator = None
        if params.seed is not None:
            self.generator = torch.Generator(device=device).manual_seed(params.seed)
        self.queue: deque[_Request] = deque()
        self.rows: list[_Request | None] = [None] * slots
        self.done: list[tuple[Hashable, Generation]] = []
        like = shape.like()
        n, h, d = shape.n_layers, shape.kv_heads, shape.head_dim
        self.cache = slab_cache(n, slots, h, d, FIRST_COLUMNS, like)
        self.slabs = [layer for layer in self.cache.layers if isinstance(layer, SlabLayer)]  # all
        # Prompts in two levels: a held token sequence (a whole prompt, or the part a prompt
        # shares with one), then the rest of the prompt when it began like a held one.
        self.prefixes = PromptSlab(n, slots, h, d, like)
        self.rests = PromptSlab(n, slots, h, d, like)
        self.sources: dict[int, Any] = {}  # row -> the prefix-cache entry holding its prompt
        self.mask = torch.zeros((slots, 0), dtype=torch.bool, device=device)
        self.next_input = torch.zeros(slots, dtype=torch.long, device=device)
        self.next_pos = torch.zeros(slots, dtype=torch.long, device=device)
        self._blocked = torch.tensor(float("-inf"), dtype=like.dtype, device=device)

    def tensors(self) -> list[torch.Tensor]:
        """The K/V slabs the session holds: rows' own columns, then both prompt slabs."""
        own = [t for layer in self.slabs for t in layer.tensors()]
        return [*own, *self.prefixes.tensors(), *self.rests.tensors()]

    @property
    def busy(self) -> bool:
        """Whether anything is decoding or waiting."""
        return bool(self.queue) or any(r is not None for r in self.rows) or bool(self.done)

    def submit(
        self, key: Hashable, prompt: list[int], max_new_tokens: int, stop_ids: frozenset[int]
    ) -> None:
        """Queue a request; its generation comes out of a later ``step`` under ``key``."""
        if not prompt:
            raise ValueError(f"request {key!r}: empty prompt (needs at least one token id)")
        if max_new_tokens < 0:
            raise ValueError(f"request {key!r}: max_new_tokens={max_new_tokens} is negative")
        request = _Request(key, list(prompt), max_new_tokens, stop_ids | self.m.stop_ids)
        if max_new_tokens == 0:
            self.done.append((key, self.m.finish(request.ids, request.logprobs, "length")))
        else:
            self.queue.append(request)

    @torch.inference_mode()
    def step(self) -> list[tuple[Hashable, Generation]]:
        """Admit waiting requests into free slots, decode one token, return what finished."""
        finished, self.done = self.done, []
        self._admit()
        busy = [j for j, r in enumerate(self.rows) if r is not None]
        if not busy:
            return finished
        k = busy[-1] + 1
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(self.rows), 1)], dim=1)
        for layer in self.slabs:
            layer.rows = k
        # Additive [k, 1, 1, columns] mask: transformers passes a 4D mask through untouched.
        mask = torch.where(self.mask[:k, None, None, :], 0.0, self._blocked)
        logits = self.m.decode_logits(
            (self.prefixes, self.rests), self.next_input[:k], self.next_pos[:k], mask, self.cache
        )
        tokens, logprobs = pick_tokens(logits, self.params, self.generator)
        for j in busy:
            finished.extend(self._take(j, int(tokens[j]), float(logprobs[j])))
        self.next_input[:k] = tokens
        self.next_pos[:k] += 1
        if finished:
            self._compact()
            self._trim()
        return finished

    def _compact(self) -> None:
        """Move the highest busy rows into free lower slots, so the busy rows are ``[0, n)``.

        Every forward runs on all slots below the highest busy one, idle or not. A row's own
        columns are only what it generated, so moving it is a small copy.
        """
        while True:
            free = next((j for j, r in enumerate(self.rows) if r is None), len(self.rows))
            last = max((j for j, r in enumerate(self.rows) if r is not None), default=-1)
            if last < free:
                return
            self.rows[free], self.rows[last] = self.rows[last], None
            for values in (self.next_input, self.next_pos, self.mask):
                values[free] = values[last]
            for layer in self.slabs:
                layer.move_row(last, free)
            self.prefixes.move(last, free)
            self.rests.move(last, free)
            self.sources[free] = self.sources.pop(last, None)

    def _trim(self) -> None:
        """Drop leading columns that no busy row uses (after long-running rows left).

        Every step's attention reads all filled columns of every row, so columns kept only for
        a finished row slow down the rows still decoding. Dropping them moves the slab's start
        (no copy); an empty session starts again from column 0.
        """
        busy = [j for j, r in enumerate(self.rows) if r is not None]
        width = self.mask.shape[1]
        cut = width if not busy else int(self.mask[busy].int().argmax(dim=1).min())
        if cut < TRIM_AT and busy:
            return
        self.mask = self.mask[:, cut:]
        for layer in self.slabs:
            layer.drop_left(cut)

    def _take(self, j: int, token: int, logprob: float) -> list[tuple[Hashable, Generation]]:
        """Record slot ``j``'s new token; free the slot when its request is done."""
        row = self.rows[j]
        assert row is not None
        row.ids.append(token)
        row.logprobs.append(logprob)
        if token in row.stops:
            reason = "stop"
        elif len(row.ids) >= row.cap:
            reason = "length"
        else:
            return []
        if self.p.keeps_sequences:
            self.p.remember(row.prompt + row.ids[:-1], self._finished_kv(j, len(row.ids)))
        self.prefixes.leave(j)
        self.rests.leave(j)
        self.sources.pop(j, None)
        self.rows[j] = None
        return [(row.key, self.m.finish(row.ids, row.logprobs, reason))]

    def _finished_kv(self, j: int, fed: int) -> torch.Tensor | Continuation:
        """What the prefix cache keeps of a finished row: its prompt's cache entry plus the
        ``fed`` columns it wrote (a small copy), or, when that entry is gone, a full copy."""
        entry = self.sources.get(j)
        if entry is None:
            return self._row_kv(j, fed)
        s = self.shape
        own = self.prefixes.like.new_empty(s.n_layers, 2, s.kv_heads, fed, s.head_dim)
        for i, layer in enumerate(self.slabs):
            keys, values = layer.row(j)
            own[i, 0], own[i, 1] = keys[:, -fed:], values[:, -fed:]
        return Continuation(entry, len(self.rows[j].prompt) - 1, own)  # type: ignore[union-attr]

    def _row_kv(self, j: int, fed: int) -> torch.Tensor:
        """Row ``j``'s whole sequence K/V, ``[layers, 2, H, len, D]``: its prompt (held prefix,
        then rest), then the ``fed`` columns it wrote (last prompt token, samples but the last)."""
        s = self.shape
        n = len(self.rows[j].prompt) - 1  # type: ignore[union-attr]
        out = self.prefixes.like.new_empty(s.n_layers, 2, s.kv_heads, n + fed, s.head_dim)
        for i, layer in enumerate(self.slabs):
            keys, values = layer.row(j)
            own = (keys[:, -fed:], values[:, -fed:])
            start = 0
            for part in (self.prefixes.row_kv(i, j), self.rests.row_kv(i, j), own):
                if part is not None:
                    stop = start + part[0].shape[1]
                    out[i, 0, :, start:stop], out[i, 1, :, start:stop] = part
                    start = stop
        return out

    def _admit(self) -> None:
        """Move queued requests into free slots, each with its prompt (but the last token) in a
        ``PromptSlab`` slot: found there when another row has the same prompt, else from
        ``PromptCache.prefix_kv`` (the prefix cache, or one prefill pass)."""
        free = [j for j, r in enumerate(self.rows) if r is None]
        joining = [(free[i], self.queue.popleft()) for i in range(min(len(free), len(self.queue)))]
        if not joining:
            return
        self.p.share_prefixes(sorted(r.prompt for _, r in joining))
        self.p.prefill_many([r.prompt[:-1] for _, r in joining])
        for j, request in joining:
            tokens = tuple(request.prompt[:-1])
            if tokens:
                self._place_prompt(j, tokens)
            self.sources[j] = self.p.cached_entry(list(tokens)) if tokens else None
            self.mask[j] = False  # the row's own columns start with its next step
            self.next_input[j] = request.prompt[-1]
            self.next_pos[j] = len(tokens)
            self.rows[j] = request
        self.p.count_prefilled(len(joining))  # each last prompt token runs in the decode step

    def _place_prompt(self, j: int, tokens: tuple[int, ...]) -> None:
        """Give row ``j`` its prompt K/V: all of a held sequence that begins with ``tokens``;
        else the part a held one shares plus the rest in ``rests``, when the rest is short;
        else a new held sequence (from ``PromptCache.prefix_kv``: the cache or a prefill)."""
        n = len(tokens)
        slot, shared = self.prefixes.longest(tokens)
        if slot is not None and shared == n:  # a GRPO sibling's prompt, or one extending it
            self.prefixes.join(j, slot, n)
            return
        if slot is not None and shared >= MIN_SHARED and n - shared <= MAX_REST:
            key = (shared, tokens)
            rest = self.rests.find(key)
            if rest is None:
                kv = self._prompt_kv(tokens)
                rest = self.rests.place(key, tokens[shared:], kv[:, :, :, shared:])
            self.prefixes.join(j, slot, shared)
            self.rests.join(j, rest, n - shared)
            return
        slot = self.prefixes.place(tokens, tokens, self._prompt_kv(tokens))
        self.prefixes.join(j, slot, n)

    def _prompt_kv(self, tokens: tuple[int, ...]) -> torch.Tensor:
        """``PromptCache.prefix_kv`` of a non-empty prompt (``_admit`` places only those)."""
        kv = self.p.prefix_kv(list(tokens))
        assert kv is not None  # None only for no tokens
        return kv
