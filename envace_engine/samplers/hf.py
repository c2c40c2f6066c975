"""``HFSampler``: batched generation with an embedded transformers model (docs/samplers.md).

A hand-written decode loop over a ``DynamicCache`` rather than ``model.generate``, because it
lets us (a) compute the log-probs of the sampling distribution for free from the logits we sample
from, (b) prefill a shared prompt prefix once and expand its KV cache to the batch, (c) drop
finished rows from the batch instead of decoding padding, and (d) project only the last
position through the LM head during prefill (``logits_to_keep=1``).

Conventions (the SGLang and TRL ones): the returned log-prob of a sampled token is
``log_softmax(logits / temperature)`` before top-k/top-p truncation; greedy decoding
(temperature < 1e-6) returns ``log_softmax(logits)``. A generation that stopped on EOS or a stop
token id ends with that token.

Weight sharing: the sampler keeps a reference to the model object, so a trainer that updates the
same object in place is sampled from at its current weights, with no copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

from envace_engine.samplers.base import Generation, SamplingParams
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
    """Batched sampling from an in-process transformers causal LM (implements ``Sampler``)."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        batch_size: int = 32,
        prefix_reuse: bool = True,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: use at least 1 prompt per forward batch")
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.prefix_reuse = prefix_reuse
        self.eos_ids = _eos_ids(model, tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.eos_ids, default=0)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """One generation per prompt, in order; prompts are batched ``batch_size`` at a time."""
        check_request(prompts, params)
        if not prompts:
            return []
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=self.model.device).manual_seed(params.seed)
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
        return [results[i] for i in range(len(prompts))]

    @torch.inference_mode()
    def _generate_chunk(
        self, prompts: list[list[int]], params: SamplingParams, generator: torch.Generator | None
    ) -> list[Generation]:
        rows = [_Row() for _ in prompts]
        if params.max_new_tokens == 0:
            return [self._finish(r, "length") for r in rows]
        stop_ids = set(self.eos_ids) | set(params.stop_token_ids)
        cache = DynamicCache(config=self.model.config)
        logits, mask, next_pos = self._prefill(prompts, cache)
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

    def _prefill(
        self, prompts: list[list[int]], cache: DynamicCache
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Fill ``cache`` with the prompts; return last logits, the mask and next positions.

        Layout per row: ``[shared prefix][left padding][own suffix]``. The shared prefix (when
        reused) is computed once at batch size 1 and repeated; padding sits between it and the
        suffix, masked out, and position ids skip it, so each row sees exactly its own prompt.
        """
        device = self.model.device
        shared = shared_prefix_len(prompts) if self.prefix_reuse and len(prompts) > 1 else 0
        if shared < MIN_SHARED_PREFIX:
            shared = 0
        if shared:
            prefix = torch.tensor([prompts[0][:shared]], device=device)
            self.model(input_ids=prefix, cache=cache, use_cache=True, logits_to_keep=1)
            cache.batch_repeat_interleave(len(prompts))
        suffixes = [p[shared:] for p in prompts]
        width = max(len(s) for s in suffixes)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long, device=device)
        suffix_mask = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
        for b, suffix in enumerate(suffixes):
            ids[b, width - len(suffix) :] = torch.tensor(suffix, device=device)
            suffix_mask[b, width - len(suffix) :] = 1
        positions = (shared + suffix_mask.cumsum(dim=1) - 1).clamp(min=0)
        mask = torch.cat([suffix_mask.new_ones(len(prompts), shared), suffix_mask], dim=1)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :].float(), mask, positions[:, -1] + 1

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
