"""Continuous batching for ``HFSampler``: requests join and leave one running decode batch.

A micro-step batch shrinks as its rows finish, and the rows that finished wait for the slowest
one before their episode can go on (parse the call, build the rehearse prompt, generate again).
A ``DecodeSession`` instead admits a request as soon as a slot is free, between two decode
steps, so an episode's rehearsal starts decoding beside the other episodes' replies, as in
SGLang's scheduler. ``HFSampler.generate`` is a session whose requests are all submitted up
front; the rollout submits each episode's next request when its last one finishes.

Layout. One slab per layer, ``[slots, kv_heads, columns, head_dim]`` (``kv.SlabLayer``). All
rows write the same column each step; a row's K/V sits right-aligned before the column where
it joined, behind masked padding, and its position ids count only its own tokens. A row joins
with every prompt token but the last already in K/V (from ``kv.PrefixCache`` or one prefill
pass) and feeds that last token in its first decode step, whose logits give its first sample.
The forward runs on slots ``[0, k)`` (a view, no copy), where ``k`` is one past the highest
busy slot; free slots inside that range decode a dummy token whose output is ignored. When a
longer prompt joins than the filled columns can hold, the slab grows on the left (one copy).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from envace_engine.samplers.base import Generation, SamplingParams
from envace_engine.samplers.kv import slab_cache
from envace_engine.samplers.sampling import pick_tokens

if TYPE_CHECKING:
    from envace_engine.samplers.hf import HFSampler

LEFT_MARGIN = 64  # extra columns when the slab grows left: fewer whole-slab copies
TRIM_AT = 64  # drop unused leading columns once there are this many


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

    def __init__(self, sampler: HFSampler, params: SamplingParams, slots: int) -> None:
        self.s = sampler
        self.params = params  # temperature, top-k, top-p and seed; caps and stops per request
        self.generator = None
        if params.seed is not None:
            device = sampler.model.device
            self.generator = torch.Generator(device=device).manual_seed(params.seed)
        self.queue: deque[_Request] = deque()
        self.rows: list[_Request | None] = [None] * slots
        self.done: list[tuple[Hashable, Generation]] = []
        self.cache = None  # the slab (a transformers Cache of SlabLayers), made on first use
        device = sampler.model.device
        self.mask = torch.zeros((slots, 0), dtype=torch.long, device=device)
        self.next_input = torch.zeros(slots, dtype=torch.long, device=device)
        self.next_pos = torch.zeros(slots, dtype=torch.long, device=device)

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
        request = _Request(key, list(prompt), max_new_tokens, stop_ids | self.s.stop_ids)
        if max_new_tokens == 0:
            self.done.append((key, self.s.finish(request.ids, request.logprobs, "length")))
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
        for layer in self.cache.layers:
            layer.rows = k
        out = self.s.model(
            input_ids=self.next_input[:k, None],
            attention_mask=self.mask[:k],
            position_ids=self.next_pos[:k, None],
            cache=self.cache,
            use_cache=True,
        )
        logits = out.logits[:, -1, :].float()
        tokens, logprobs = pick_tokens(logits, self.params, self.generator)
        for j in busy:
            finished.extend(self._take(j, int(tokens[j]), float(logprobs[j])))
        self.next_input[:k] = tokens
        self.next_pos[:k] += 1
        if finished:
            self._trim()
        return finished

    def _trim(self) -> None:
        """Drop leading columns that no busy row uses (after long rows left the batch).

        Every step's attention reads all filled columns of every row, so columns kept only for
        a finished long prompt slow down the rows still decoding. Dropping them is a view of
        the slab (no copy); an empty session starts again from column 0.
        """
        busy = [j for j, r in enumerate(self.rows) if r is not None]
        width = self.mask.shape[1]
        cut = width if not busy else int(self.mask[busy].argmax(dim=1).min())
        if cut < TRIM_AT and busy:
            return
        self.mask = self.mask[:, cut:]
        for layer in self.cache.layers:
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
        # The slab holds K/V of the prompt and of every sampled token but the last, in the
        # columns since the row joined (right-aligned prompt, then one column per step).
        tokens = row.prompt + row.ids[:-1]
        start = self.mask.shape[1] - len(tokens)
        self.s.remember_row(tokens, self.cache, j, start)
        self.rows[j] = None
        return [(row.key, self.s.finish(row.ids, row.logprobs, reason))]

    def _admit(self) -> None:
        """Move queued requests into free slots, with their prompts (but the last token) in K/V."""
        free = [j for j, r in enumerate(self.rows) if r is None]
        joining = [(free[i], self.queue.popleft()) for i in range(min(len(free), len(self.queue)))]
        if not joining:
            return
        self.s.share_prefixes(sorted(r.prompt for _, r in joining))
        blocks = [(j, r, self.s.prefix_kv(r.prompt[:-1])) for j, r in joining]
        self._make_room(max(len(r.prompt) - 1 for _, r in joining))
        width = self.mask.shape[1]
        for j, request, kv in blocks:
            n = len(request.prompt) - 1
            self.mask[j] = 0
            self.mask[j, width - n :] = 1
            for i, layer in enumerate(self.cache.layers):
                # Columns before the prompt are masked padding: zero them (a free row's slab may
                # hold anything, and masked weights are 0, but 0*NaN is NaN).
                layer._k[j, :, : width - n] = 0
                layer._v[j, :, : width - n] = 0
                if n:
                    layer._k[j, :, width - n : width] = kv[i, 0]
                    layer._v[j, :, width - n : width] = kv[i, 1]
            self.next_input[j] = request.prompt[-1]
            self.next_pos[j] = n
            self.rows[j] = request
        self.s.prefilled += len(joining)  # each last prompt token runs in the decode step

    def _make_room(self, needed: int) -> None:
        """Ensure ``needed`` filled columns exist before the next one (grow left if not)."""
        width = self.mask.shape[1]
        if self.cache is None:
            s = self.s
            like = next(s.model.parameters())
            capacity = needed + LEFT_MARGIN + 256
            self.cache = slab_cache(
                s.n_layers, len(self.rows), s.kv_heads, s.head_dim, capacity, like
            )
        if needed <= width:
            return
        grow = needed - width + (LEFT_MARGIN if width else 0)
        for layer in self.cache.layers:
            layer.shift_right(grow)
        pad = self.mask.new_zeros(len(self.rows), grow)
        self.mask = torch.cat([pad, self.mask], dim=1)
