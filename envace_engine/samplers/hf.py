"""``HFSampler``: batched generation with an embedded transformers model (docs/samplers.md).

A hand-written decode loop rather than ``model.generate``, because it lets us (a) compute the
log-probs of the sampling distribution for free from the logits we sample from, (b) keep the K/V
of prompt prefixes across calls (``kv.PrefixCache``: an episode's next prompt extends its last
one, and a batch's GRPO group shares its prompt), so each call only prefills new tokens, (c)
drop finished rows from the batch instead of decoding padding, (d) write the cache into a
preallocated slab instead of re-concatenating it every token, and (e) project only the last
position through the LM head during prefill (``logits_to_keep=1``).

Conventions (the SGLang and TRL ones): the returned log-prob of a sampled token is
``log_softmax(logits / temperature)`` before top-k/top-p truncation; greedy decoding
(temperature < 1e-6) returns ``log_softmax(logits)``. A generation that stopped on EOS or a stop
token id ends with that token.

Weight sharing: the sampler keeps a reference to the model object, so a trainer that updates the
same object in place is sampled from at its current weights, with no copy. Cached K/V belong to
the weights that computed them: every call compares the parameters' in-place version counters
with those of the last call and empties the cache when any weight changed.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from envace_engine.samplers.base import Generation, SamplingParams
from envace_engine.samplers.kv import PrefixCache, row_kv, slab_cache
from envace_engine.samplers.validation import check_request, is_greedy

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

MIN_SHARED_PREFIX = 8  # shorter common prefixes are not worth an extra forward pass


@dataclass
class _Row:
    """Decode state of one prompt in a chunk: what it has sampled so far."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str = ""


class HFSampler:
    """Batched sampling from an in-process transformers causal LM (implements ``Sampler``).

    ``prefix_reuse`` shares prompt prefixes: within a call (a prefix common to several prompts
    is prefilled once) and, up to ``prefix_cache_tokens`` cached tokens, across calls. The
    default budget holds the recent sequences of a 32-episode GRPO batch of a small model
    (SmolLM2-135M: 46 KB of fp32 K/V per token, so 65536 tokens = 3 GB).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        batch_size: int = 32,
        prefix_reuse: bool = True,
        prefix_cache_tokens: int = 65536,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: use at least 1 prompt per forward batch")
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.prefix_reuse = prefix_reuse
        self.cache = PrefixCache(prefix_cache_tokens if prefix_reuse else 0)
        self._weights_stamp: tuple[int, ...] = ()
        self.prefilled = 0  # prompt tokens actually run through the model (metrics, tests)
        self.eos_ids = _eos_ids(model, tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.eos_ids, default=0)
        config = model.config.get_text_config(decoder=True)
        self.n_layers = config.num_hidden_layers
        heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """One generation per prompt, in order; prompts are batched ``batch_size`` at a time."""
        check_request(prompts, params)
        if not prompts:
            return []
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=self.model.device).manual_seed(params.seed)
        self._check_weights()
        # Sorting the token lists puts shared prefixes (GRPO groups, rehearsals) and similar
        # lengths in the same chunk: more prefix reuse, less padding.
        order = sorted(range(len(prompts)), key=lambda i: prompts[i])
        results: dict[int, Generation] = {}
        was_training = self.model.training
        self.model.eval()  # the trainer may have left dropout on; sampling must not use it
        try:
            for start in range(0, len(order), self.batch_size):
                chunk = order[start : start + self.batch_size]
                gens = self._generate_chunk([prompts[i] for i in chunk], params, generator)
                results.update(zip(chunk, gens, strict=True))
        finally:
            self.model.train(was_training)
            self.cache.end_call()
        return [results[i] for i in range(len(prompts))]

    def _check_weights(self) -> None:
        """Empty the prefix cache when any parameter changed in place since the last call."""
        stamp = tuple(p._version for p in self.model.parameters())
        if stamp != self._weights_stamp:
            self.cache = PrefixCache(self.cache.max_tokens)
            self._weights_stamp = stamp

    @torch.inference_mode()
    def _generate_chunk(
        self, prompts: list[list[int]], params: SamplingParams, generator: torch.Generator | None
    ) -> list[Generation]:
        rows = [_Row() for _ in prompts]
        if params.max_new_tokens == 0:
            return [self._finish(r, "length") for r in rows]
        stop_ids = set(self.eos_ids) | set(params.stop_token_ids)
        keep_finished = self.prefix_reuse and self.cache.max_tokens > 0
        if self.prefix_reuse:
            self._warm(prompts)
        cache, logits, mask, next_pos = self._prefill(prompts, params.max_new_tokens)
        live = list(range(len(prompts)))  # chunk row of each batch row
        for step in range(params.max_new_tokens):
            tokens, logprobs = pick_tokens(logits, params, generator)
            keep = []
            for b, (tok, lp) in enumerate(zip(tokens.tolist(), logprobs.tolist(), strict=True)):
                row = rows[live[b]]
                row.ids.append(tok)
                row.logprobs.append(lp)
                if tok in stop_ids:
                    row.finish = "stop"
                elif step + 1 == params.max_new_tokens:
                    row.finish = "length"
                else:
                    keep.append(b)
                    continue
                if keep_finished:  # the cache holds the prompt and all but the last token
                    held = mask[b].nonzero().squeeze(1)
                    self.cache.insert(prompts[live[b]] + row.ids[:-1], row_kv(cache, b, held))
            if not keep:
                break
            if len(keep) < len(live):  # drop finished rows instead of decoding padding
                index = torch.tensor(keep, device=mask.device)
                cache.batch_select_indices(index)
                live = [live[b] for b in keep]
                mask, next_pos, tokens = mask[index], next_pos[index], tokens[index]
            mask = torch.cat([mask, mask.new_ones(len(live), 1)], dim=1)
            out = self.model(
                input_ids=tokens[:, None],
                attention_mask=mask,
                position_ids=next_pos[:, None],
                cache=cache,
                use_cache=True,
            )
            logits = out.logits[:, -1, :].float()
            next_pos = next_pos + 1
        return [self._finish(r, r.finish or "length") for r in rows]

    def _warm(self, prompts: list[list[int]]) -> None:
        """Prefill into the prefix cache what the batched prefill would otherwise pad.

        First each prefix that neighbouring prompts share (``prompts`` arrive sorted, so those
        are neighbours), once; then, one row at a time, every prompt but its last token. The
        batched pass that follows then runs one token per row: prefill compute is linear in
        tokens, so batching it buys nothing, while padding every row to the longest uncached
        suffix (a rehearse prompt's own history runs to hundreds of tokens) wastes a third or
        more of it. Only gaps of at least ``MIN_SHARED_PREFIX`` tokens get their own pass.
        """
        for a, b in itertools.pairwise(prompts):
            shared = shared_prefix_len([a, b])
            held = min(self.cache.lookup(a)[1], self.cache.lookup(b)[1])
            if shared - held >= MIN_SHARED_PREFIX:
                self._remember(a[:shared])
        for prompt in prompts:
            if len(prompt) - 1 - self.cache.lookup(prompt)[1] >= MIN_SHARED_PREFIX:
                self._remember(prompt[:-1])

    def _remember(self, tokens: list[int]) -> None:
        """Compute the K/V of ``tokens`` (reusing what is cached) and keep it in the cache."""
        cache, _, mask, _ = self._prefill([tokens], 0)
        self.cache.insert(tokens, row_kv(cache, 0, mask[0].nonzero().squeeze(1)))

    def _prefill(
        self, prompts: list[list[int]], room: int
    ) -> tuple[object, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run the uncached part of every prompt; return (cache, last logits, mask, next pos).

        Layout per row: ``[left padding][cached prefix][left padding][own suffix]``, with ``room``
        free positions after it for decoding. Padding is masked and position ids skip it, so each
        row sees exactly its own prompt.
        """
        device = self.model.device
        hits = [self.cache.lookup(p) if self.prefix_reuse else (None, 0) for p in prompts]
        width_p = max(n for _, n in hits)
        suffixes = [p[n:] for p, (_, n) in zip(prompts, hits, strict=True)]
        width_s = max(len(s) for s in suffixes)
        like = next(self.model.parameters())
        cache = slab_cache(
            self.n_layers,
            len(prompts),
            self.kv_heads,
            self.head_dim,
            width_p + width_s + room,
            like,
        )
        mask = torch.zeros((len(prompts), width_p + width_s), dtype=torch.long, device=device)
        if width_p:
            self._load_prefixes(cache, hits, width_p, mask)
        ids = torch.full((len(prompts), width_s), self.pad_id, dtype=torch.long, device=device)
        for b, suffix in enumerate(suffixes):
            if suffix:
                ids[b, width_s - len(suffix) :] = torch.tensor(suffix, device=device)
                mask[b, width_p + width_s - len(suffix) :] = 1
        held = torch.tensor([n for _, n in hits], device=device)
        positions = (held[:, None] + mask[:, width_p:].cumsum(dim=1) - 1).clamp(min=0)
        self.prefilled += sum(len(s) for s in suffixes)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return cache, out.logits[:, -1, :].float(), mask, positions[:, -1] + 1

    def _load_prefixes(self, cache: object, hits: list, width: int, mask: torch.Tensor) -> None:
        """Copy each row's cached K/V, right-aligned, into the first ``width`` slab positions."""
        for layer in cache.layers:
            layer._k[:, :, :width] = 0  # padding must be finite: masked weights are 0, not 0*NaN
            layer._v[:, :, :width] = 0
        for b, (entry, n) in enumerate(hits):
            if entry is None or n == 0:
                continue
            self.cache.use(entry, n)
            mask[b, width - n : width] = 1
            for i, layer in enumerate(cache.layers):
                layer._k[b, :, width - n : width] = entry.kv[i, 0, :, :n]
                layer._v[b, :, width - n : width] = entry.kv[i, 1, :, :n]
        for layer in cache.layers:
            layer.length = width
            layer._refresh()

    def _finish(self, row: _Row, finish: str) -> Generation:
        shown = row.ids[:-1] if finish == "stop" else row.ids  # text drops the stop token
        text = self.tokenizer.decode(shown, skip_special_tokens=True)
        return Generation(tuple(row.ids), tuple(row.logprobs), finish, text=text)


def shared_prefix_len(prompts: list[list[int]]) -> int:
    """Length of the longest common token prefix, capped so every prompt keeps one own token.

    The cap matters because the logits for the first new token come from each row's last prompt
    position, which must be computed in the batched suffix pass.
    """
    limit = min(len(p) for p in prompts) - 1
    first = prompts[0]
    n = 0
    while n < limit and all(p[n] == first[n] for p in prompts):
        n += 1
    return n


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
    filtered = truncate_logits(scaled, params.top_k, params.top_p)
    probs = torch.softmax(filtered, dim=-1)
    tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    return tokens, logp.gather(1, tokens[:, None]).squeeze(1)


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


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    """EOS ids from the generation config (may be a list) and the tokenizer, de-duplicated."""
    ids: list[int] = []
    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None) if config is not None else None
    if eos is None:
        eos = model.config.eos_token_id
    if isinstance(eos, int):
        ids.append(eos)
    elif eos is not None:
        ids.extend(eos)
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return tuple(dict.fromkeys(ids))
