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

import contextlib
import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from transformers.cache_utils import Cache

from envace_engine.samplers.base import Generation, SamplingParams
from envace_engine.samplers.kv import PrefixCache, SlabLayer, row_kv
from envace_engine.samplers.session import DecodeSession
from envace_engine.samplers.validation import check_request, is_greedy

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

MIN_SHARED_PREFIX = 8  # shorter common prefixes are not worth an extra forward pass


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
        """One generation per prompt, in order, decoded ``batch_size`` rows at a time."""
        check_request(prompts, params)
        if not prompts:
            return []
        stops = frozenset(self.eos_ids) | frozenset(params.stop_token_ids)
        results: dict[int, Generation] = {}
        with self.session(params) as session:
            # Sorted token lists put shared prefixes (GRPO groups, rehearsals) side by side.
            for i in sorted(range(len(prompts)), key=lambda i: prompts[i]):
                session.submit(i, prompts[i], params.max_new_tokens, stops)
            while session.busy:
                results.update(session.step())
        return [results[i] for i in range(len(prompts))]

    @contextlib.contextmanager
    def session(self, params: SamplingParams) -> Iterator[DecodeSession]:
        """A continuous-batching session (``samplers.session``) with ``batch_size`` slots.

        ``params`` gives temperature, top-k, top-p and seed; each request brings its own token
        cap and stop ids. The model is in eval mode for the session and the prefix cache is
        trimmed to its budget when it ends.
        """
        check_request([], params)
        self._check_weights()
        was_training = self.model.training
        self.model.eval()  # the trainer may have left dropout on; sampling must not use it
        try:
            yield DecodeSession(self, params, self.batch_size)
        finally:
            self.model.train(was_training)
            self.cache.end_call()

    @property
    def stop_ids(self) -> frozenset[int]:
        """The model's end-of-sequence ids (a request adds its own stop ids)."""
        return frozenset(self.eos_ids)

    def _check_weights(self) -> None:
        """Empty the prefix cache when any parameter changed in place since the last call."""
        stamp = tuple(p._version for p in self.model.parameters())
        if stamp != self._weights_stamp:
            self.cache = PrefixCache(self.cache.max_tokens)
            self._weights_stamp = stamp

    def share_prefixes(self, prompts: list[list[int]]) -> None:
        """Put in the prefix cache, computed once, each prefix that neighbouring prompts share.

        ``prompts`` are sorted, so prompts sharing a prefix are neighbours. Only a prefix at
        least ``MIN_SHARED_PREFIX`` tokens longer than what the cache holds for both gets its
        own pass; each prompt's remaining tokens are then computed alone (``prefix_kv``), since
        prefill compute is linear in tokens and batching rows of unequal length only adds
        padding.
        """
        if not self.prefix_reuse:
            return
        for a, b in itertools.pairwise(prompts):
            shared = shared_prefix_len([a, b])
            held = min(self.cache.lookup(a)[1], self.cache.lookup(b)[1])
            if shared - held >= MIN_SHARED_PREFIX:
                self.prefix_kv(a[:shared])

    @torch.inference_mode()
    def prefix_kv(self, tokens: list[int]) -> torch.Tensor | None:
        """K/V of ``tokens`` (``[layers, 2, H, len, D]``), from the cache or computed and kept."""
        if not tokens:
            return None
        if self.prefix_reuse:
            entry, held = self.cache.lookup((*tokens, -1))
            if entry is not None and held == len(tokens):
                self.cache.use(entry, held)
                return entry.kv[:, :, :, :held]
        kv = self._prefill(tokens)
        if self.prefix_reuse:
            self.cache.insert(tokens, kv)
        return kv

    def remember_row(self, tokens: list[int], cache: Any, row: int, start: int) -> None:
        """Keep a finished row's K/V (``tokens``, from slab column ``start`` on) for later."""
        if self.prefix_reuse and self.cache.max_tokens > 0:
            self.cache.insert(tokens, row_kv(cache, row, start, start + len(tokens)))

    def _prefill(self, tokens: list[int]) -> torch.Tensor:
        """K/V of ``tokens``: their longest cached prefix copied, the rest run through the model.

        The slab's layers are views into one ``[layers, 2, 1, H, len, D]`` buffer, so the
        result is that buffer (no copy) and nothing needs zeroing: every column gets written.
        """
        entry, held = self.cache.lookup(tokens) if self.prefix_reuse else (None, 0)
        like = next(self.model.parameters())
        kv = like.new_empty(self.n_layers, 2, 1, self.kv_heads, len(tokens), self.head_dim)
        if entry is not None and held:
            self.cache.use(entry, held)
            kv[:, :, 0, :, :held] = entry.kv[:, :, :, :held]
        cache = Cache(layers=[SlabLayer(kv[i, 0], kv[i, 1], held) for i in range(self.n_layers)])
        device = self.model.device
        self.model(
            input_ids=torch.tensor([tokens[held:]], device=device),
            attention_mask=torch.ones((1, len(tokens)), dtype=torch.long, device=device),
            position_ids=torch.arange(held, len(tokens), device=device)[None],
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.prefilled += len(tokens) - held
        return kv[:, :, 0]

    def pick(
        self, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample one token per row (``pick_tokens``)."""
        return pick_tokens(logits, params, generator)

    def finish(self, ids: list[int], logprobs: list[float], reason: str) -> Generation:
        """A finished generation; its text drops a final stop token."""
        shown = ids[:-1] if reason == "stop" else ids
        text = self.tokenizer.decode(shown, skip_special_tokens=True)
        return Generation(tuple(ids), tuple(logprobs), reason, text=text)


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
    tokens = sample_categorical(torch.softmax(filtered, dim=-1), generator)
    return tokens, logp.gather(1, tokens[:, None]).squeeze(1)


def sample_categorical(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One index per row of ``probs`` by inverse CDF: one uniform draw per row.

    ``torch.multinomial`` costs ~30 ms for 32 rows of SmolLM2's 49152-token vocabulary on a CPU
    (as does any method drawing one random number per token); a float64 cumulative sum and a
    binary search take ~3 ms. Float64 keeps the cumulative sum exact enough that no token's
    probability is biased; a draw landing on a zero-probability token (possible only through
    rounding at the very end of the sum) is replaced by the row's most likely token.
    """
    cdf = probs.double().cumsum(dim=-1)
    draw = torch.rand(
        (probs.shape[0], 1), generator=generator, dtype=torch.float64, device=probs.device
    )
    index = torch.searchsorted(cdf, draw * cdf[:, -1:], right=True)
    index = index.clamp(max=probs.shape[1] - 1).squeeze(1)
    possible = probs.gather(1, index[:, None]).squeeze(1) > 0
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
