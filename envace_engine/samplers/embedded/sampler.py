"""``HFSampler``: batched generation with an embedded transformers model (docs/samplers.md).

A hand-written decode loop rather than ``model.generate``, because it lets us (a) compute the
log-probs of the sampling distribution for free from the logits we sample from, (b) keep the K/V
of prompt prefixes across calls (``kv.PrefixCache``: an episode's next prompt extends its last
one, and a batch's GRPO group shares its prompt), so each call only prefills new tokens, (c)
batch continuously (``session.DecodeSession``: rows join and leave a running batch, written
into a preallocated slab instead of re-concatenating the cache every token), and (d) project
only the last position through the LM head during prefill (``logits_to_keep=1``).

Log-prob conventions (SGLang's and TRL's) are those of ``sampling.pick_tokens``. A generation
that stopped on EOS or a stop token id ends with that token.

Weight sharing: the sampler keeps a reference to the model object, so a trainer that updates the
same object in place is sampled from at its current weights, with no copy. Cached K/V belong to
the weights that computed them: every call compares the parameters' in-place version counters
with those of the last call and empties the cache when any weight changed.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from transformers.cache_utils import Cache

from envace_engine.samplers.base import Generation, SamplingParams
from envace_engine.samplers.embedded import cascade, prefill
from envace_engine.samplers.embedded.cascade import PromptSlab
from envace_engine.samplers.embedded.heap import keep_freed_memory
from envace_engine.samplers.embedded.kv import (
    BLOCK,
    Continuation,
    PrefixCache,
    SlabLayer,
    storage_bytes,
)
from envace_engine.samplers.embedded.llama_step import LlamaDecodeStep, Segment, unsupported
from envace_engine.samplers.embedded.packed import (
    PackedLinears,
    cpu_bf16,
    onednn_bf16,
    supported,
)
from envace_engine.samplers.embedded.session import DecodeSession, KVShape
from envace_engine.samplers.validation import check_request

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

MIN_SHARED_PREFIX = 8  # shorter common prefixes are not worth an extra forward pass
# New tokens per batched prefill pass (``prefill_many``): enough rows for the GEMMs to run
# near their peak, few enough that its activations stay small (~60 MB for SmolLM2-135M).
PREFILL_BATCH_TOKENS = 4096
LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class KVMemory:
    """Bytes of K/V an ``HFSampler`` holds now: the prefix cache (``cache_tokens`` tokens in
    its entries) and the slabs of its open decode sessions."""

    cache_tokens: int
    cache_bytes: int
    session_bytes: int


class HFSampler:
    """Batched sampling from an in-process transformers causal LM.

    Implements ``SessionSampler``; for its sessions it is both the ``DecodeModel`` and the
    ``PromptCache`` (``session``), the only members a ``DecodeSession`` uses.

    ``prefix_reuse`` shares prompt prefixes: within a call (a prefix common to several prompts
    is prefilled once) and, up to ``prefix_cache_tokens`` cached tokens, across calls. The
    default budget holds the recent sequences of a 32-episode GRPO batch of a small model
    (SmolLM2-135M: 46 KB of fp32 K/V per token, so 65536 tokens = 3 GB). ``packed_weights``
    runs the forwards from oneDNN-packed copies of the linear weights (``packed.py``: faster on
    a CPU); ``dtype`` (``auto`` | ``float32`` | ``bfloat16``) is their compute dtype: ``auto``
    takes bf16 where the CPU has a native bf16 unit (AMX-BF16, AVX512-BF16), keeping norms,
    attention and the softmax over the logits in fp32, so the log-probs stay close to the
    trainer's (``rollout/logprob_diff`` measures how close). The packed copies are one more
    copy of the weights in memory. ``compact_decode`` runs decode steps and prefills of a
    Llama model through ``llama_step`` instead of the model's own forward (fewer operations
    per step; the prompts a session admits together prefilled in one pass: ``prefill_many``). On
    a CPU it also makes the process keep freed heap memory for reuse (``heap.py``).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        batch_size: int = 32,
        prefix_reuse: bool = True,
        prefix_cache_tokens: int = 65536,
        call_cache_tokens: int | None = None,
        packed_weights: bool = True,
        dtype: str = "auto",
        compact_decode: bool = True,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: use at least 1 prompt per forward batch")
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.prefix_reuse = prefix_reuse
        self.cache = PrefixCache(prefix_cache_tokens if prefix_reuse else 0)
        if call_cache_tokens is not None and call_cache_tokens < 0:
            raise ValueError(f"call_cache_tokens={call_cache_tokens}: use None (no bound) or >= 0")
        self.call_cache_tokens = call_cache_tokens
        self.compute_dtype = compute_dtype(model, dtype, packed_weights)
        self.packed = PackedLinears(  # CPU only: see packed.py
            model,
            enabled=packed_weights,
            dtype=torch.bfloat16 if self.compute_dtype == "bfloat16" else None,
        )
        if model.device.type == "cpu":
            keep_freed_memory()  # process-wide: see heap.py
        why_not = unsupported(model, self.packed) if compact_decode else "compact_decode=False"
        # ``unsupported`` returned None: the model is a LlamaForCausalLM
        self.compact = LlamaDecodeStep(cast(Any, model), self.packed) if why_not is None else None
        LOG.debug("embedded sampler decode step: %s", why_not or "compact (llama_step)")
        self._weights_stamp: tuple[int, ...] = ()
        self._open: list[DecodeSession] = []  # sessions in flight (``kv_memory``)
        self.prefilled = 0  # prompt tokens actually run through the model (metrics, tests)
        self.generated = 0  # tokens generated so far (``TokenCounting``: progress shows tok/s)
        self.eos_ids = _eos_ids(model, tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.eos_ids, default=0)
        config = model.config.get_text_config(decoder=True)
        heads = config.num_attention_heads
        like = next(model.parameters())
        self.kv_shape = KVShape(
            n_layers=config.num_hidden_layers,
            kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            dtype=like.dtype,
            device=like.device,
        )

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """One generation per prompt, in order, decoded ``batch_size`` rows at a time."""
        check_request(prompts, params)
        if not prompts:
            return []
        stops = frozenset(self.eos_ids) | frozenset(params.stop_token_ids)
        results: dict[Hashable, Generation] = {}  # keyed by prompt index
        with self.session(params) as session:
            # Sorted token lists put shared prefixes (GRPO groups, rehearsals) side by side.
            for i in sorted(range(len(prompts)), key=lambda i: prompts[i]):
                session.submit(i, prompts[i], params.max_new_tokens, stops)
            while session.busy:
                results.update(session.step())
        return [results[i] for i in range(len(prompts))]

    @contextlib.contextmanager
    def session(self, params: SamplingParams) -> Iterator[DecodeSession]:
        """A continuous-batching session (``samplers.embedded.session``) with ``batch_size`` slots.

        ``params`` gives temperature, top-k, top-p and seed; each request brings its own token
        cap and stop ids. The model is in eval mode for the session and the prefix cache is
        trimmed to its budget when it ends.
        """
        check_request([], params)
        self._check_weights()
        was_training = self.model.training
        self.model.eval()  # the trainer may have left dropout on; sampling must not use it
        session = DecodeSession(self, self, params, self.batch_size)
        self._open.append(session)
        try:
            yield session
        finally:
            self._open.remove(session)
            self.model.train(was_training)
            self.cache.end_call()

    def kv_memory(self) -> KVMemory:
        """What the prefix cache and the open sessions hold now (distinct storages)."""
        return KVMemory(
            cache_tokens=self.cache.tokens,
            cache_bytes=storage_bytes(self.cache.tensors()),
            session_bytes=storage_bytes(t for s in self._open for t in s.tensors()),
        )

    @property
    def stop_ids(self) -> frozenset[int]:
        """The model's end-of-sequence ids (a request adds its own stop ids)."""
        return frozenset(self.eos_ids)

    def drop_cache(self) -> None:
        """Empty the prefix cache (``CacheHolding``): its K/V is freed once no session holds it."""
        self.cache = PrefixCache(self.cache.max_tokens)

    def _check_weights(self) -> None:
        """Empty the prefix cache when any parameter changed in place since the last call."""
        stamp = tuple(p._version for p in self.model.parameters())
        if stamp != self._weights_stamp:
            self.drop_cache()
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
    def prefill_many(self, prompts: list[list[int]]) -> None:
        """Put each prompt's K/V in the prefix cache, the prompts' new tokens batched into
        passes of up to ``PREFILL_BATCH_TOKENS`` (``LlamaDecodeStep.prefill``); their
        ``prefix_kv`` then finds them there. Without the compact step (or the cache) it does
        nothing: each ``prefix_kv`` prefills alone, as before."""
        if self.compact is None or not self.prefix_reuse:
            return
        # A prompt shorter than a cache block is not kept (``PrefixCache.insert``): left to
        # ``prefix_kv``, which computes it where it is used.
        todo = [list(t) for t in dict.fromkeys(tuple(p) for p in prompts if len(p) >= BLOCK)]
        batch: list[tuple[list[int], Segment]] = []
        new = 0
        for tokens in todo:
            found = self.cache.lookup((*tokens, -1))
            if found[1] == len(tokens):  # held whole: ``prefix_kv`` finds it
                continue
            batch.append((tokens, segment := self._segment(tokens, found)))
            new += len(segment.tokens)
            if new >= PREFILL_BATCH_TOKENS:
                self._prefill_batch(batch)
                batch, new = [], 0
        if batch:
            self._prefill_batch(batch)

    def _segment(self, tokens: list[int], found: tuple[Any, int] | None = None) -> Segment:
        """A prefill segment of ``tokens``: a K/V buffer holding their longest cached prefix
        (``found``: the cache's lookup of them, when the caller has made it)."""
        if found is None:
            found = self.cache.lookup(tokens) if self.prefix_reuse else (None, 0)
        entry, held = found
        s = self.kv_shape
        kv = s.like().new_empty(s.n_layers, 2, s.kv_heads, len(tokens), s.head_dim)
        if entry is not None and held:
            self.cache.use(entry, held)
            kv[:, :, :, :held] = entry.kv[:, :, :, :held]
        return Segment(kv, held, tuple(tokens[held:]))

    def _prefill_batch(self, batch: list[tuple[list[int], Segment]]) -> None:
        """One ``LlamaDecodeStep.prefill`` pass over ``batch``; each prompt's K/V kept."""
        assert self.compact is not None  # prefill_many checked
        self.compact.prefill([seg for _, seg in batch])
        for tokens, seg in batch:
            self.prefilled += len(seg.tokens)
            self._keep(tokens, seg.kv)

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
            self._keep(tokens, kv)
        return kv

    @property
    def keeps_sequences(self) -> bool:
        """Whether finished sequences are kept for later prompts (``remember``)."""
        return self.prefix_reuse and self.cache.max_tokens > 0

    def remember(self, tokens: list[int], kv: torch.Tensor | Continuation) -> None:
        """Keep a finished sequence's K/V (``[layers, 2, H, len(tokens), D]``, or a cached
        prefix plus the rest: ``kv.Continuation``) for later."""
        if self.keeps_sequences:
            self._keep(tokens, kv)

    def _keep(self, tokens: list[int], kv: torch.Tensor | Continuation) -> None:
        """Insert into the prefix cache, then hold it to ``call_cache_tokens`` (if set)."""
        self.cache.insert(tokens, kv)
        if self.call_cache_tokens is not None:
            self.cache.evict(self.call_cache_tokens)

    def _prefill(self, tokens: list[int]) -> torch.Tensor:
        """K/V of ``tokens``: their longest cached prefix copied, the rest run through the model.

        Through the compact step where it applies (``prefill_many`` does too: one code path,
        so a prompt's K/V does not depend on which of the two computed it), else through
        transformers. The slab's layers are views into one ``[layers, 2, 1, H, len, D]``
        buffer, so the result is that buffer (no copy) and nothing needs zeroing: every column
        gets written.
        """
        if self.compact is not None:
            segment = self._segment(tokens)
            self.compact.prefill([segment])
            self.prefilled += len(segment.tokens)
            return segment.kv
        entry, held = self.cache.lookup(tokens) if self.prefix_reuse else (None, 0)
        s = self.kv_shape
        kv = s.like().new_empty(s.n_layers, 2, 1, s.kv_heads, len(tokens), s.head_dim)
        if entry is not None and held:
            self.cache.use(entry, held)
            kv[:, :, 0, :, :held] = entry.kv[:, :, :, :held]
        cache = Cache(layers=[SlabLayer(kv[i, 0], kv[i, 1], held) for i in range(s.n_layers)])
        device = self.model.device
        with prefill.active(self.model):  # cached columns and new ones apart (prefill.py)
            self.forward(
                input_ids=torch.tensor([tokens[held:]], device=device),
                attention_mask=torch.ones((1, len(tokens)), dtype=torch.long, device=device),
                position_ids=torch.arange(held, len(tokens), device=device)[None],
                cache=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        self.prefilled += len(tokens) - held
        return kv[:, :, 0]

    def forward(self, **inputs: Any) -> Any:
        """One forward of the model with the packed linear weights (``packed``)."""
        with self.packed.active():
            return self.model(**inputs)

    def decode_logits(
        self,
        slabs: tuple[PromptSlab, ...],
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: Cache,
    ) -> torch.Tensor:
        """A decode step's fp32 logits, attention reading the session's prompt slabs
        (``cascade``): the compact step where it applies (``llama_step``), else the model's
        own forward."""
        if self.compact is not None:
            return self.compact(input_ids, position_ids, attention_mask, cache, slabs)
        with cascade.active(self.model, slabs):
            out = self.forward(
                input_ids=input_ids[:, None],
                attention_mask=attention_mask,
                position_ids=position_ids[:, None],
                cache=cache,
                use_cache=True,
            )
        return out.logits[:, -1, :].float()

    def count_prefilled(self, n: int) -> None:
        """Count prompt tokens a session ran in its decode step (``prefilled``)."""
        self.prefilled += n

    def cached_entry(self, tokens: list[int]) -> Any:
        """The prefix-cache entry holding all of ``tokens`` now, or None."""
        if not self.keeps_sequences:
            return None
        entry, held = self.cache.lookup((*tokens, -1))
        return entry if held == len(tokens) else None

    def finish(self, ids: list[int], logprobs: list[float], reason: str) -> Generation:
        """A finished generation; its text drops a final stop token."""
        self.generated += len(ids)
        shown = ids[:-1] if reason == "stop" else ids
        # One id list decodes to one str (transformers types decode for batches too).
        text = cast(str, self.tokenizer.decode(shown, skip_special_tokens=True))
        return Generation(tuple(ids), tuple(logprobs), reason, text=text)


DTYPES = ("auto", "float32", "bfloat16")


def compute_dtype(model: PreTrainedModel, dtype: str, packed: bool) -> str:
    """The GEMM dtype the sampler runs: ``auto`` is bf16 on a CPU with a native bf16 unit
    (``packed.cpu_bf16``) and the packed path, else the weights' own. Logged once per choice."""
    if dtype not in DTYPES:
        raise ValueError(f"sampler dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    cpu = next(model.parameters()).device.type == "cpu"
    unit = cpu_bf16() if cpu else None
    if dtype == "auto":
        native = cpu and packed and unit and onednn_bf16() and supported(model)
        dtype = "bfloat16" if native else "float32"
    if dtype == "bfloat16" and not (cpu and packed and supported(model)):
        raise ValueError(
            "sampler dtype 'bfloat16' needs the packed oneDNN path on a CPU (packed_weights=True "
            "and a CPU float model): use dtype 'float32' or 'auto'"
        )
    if dtype == "bfloat16" and not onednn_bf16():
        raise ValueError(
            "sampler dtype 'bfloat16': this CPU lacks what oneDNN's bf16 linear needs "
            "(avx_ne_convert, or avx512bw + avx512vl + avx512dq): use dtype 'float32' or 'auto'"
        )
    _log_choice(dtype, unit)
    return dtype


@functools.cache
def _log_choice(dtype: str, unit: str | None) -> None:
    if dtype == "bfloat16":
        note = f"CPU has {unit}" if unit else "no native bf16 unit: emulated, likely slower"
        LOG.info("embedded sampler: bf16 GEMMs on oneDNN-packed weights (%s)", note)
    else:
        LOG.info("embedded sampler: fp32 GEMMs (no native bf16 unit, or dtype=float32)")


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
