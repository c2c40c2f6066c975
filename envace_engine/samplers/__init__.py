"""Samplers: token-id prompts in; token ids, log-probs and a finish reason out (docs/samplers.md).

``make_sampler`` builds the right one from a resolved ``ModelSpec``. Implementations are imported
lazily: ``hf`` needs torch, ``sglang`` only httpx, and importing this package needs neither.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from envace_engine.models import ModelError, ModelSpec, load_model, load_tokenizer
from envace_engine.samplers.base import Generation, Sampler, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["Generation", "Sampler", "SamplingParams", "make_sampler"]


def make_sampler(
    spec: ModelSpec,
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    **options: Any,
) -> Sampler:
    """``HFSampler`` for a local checkpoint spec, ``SGLangSampler`` for an SGLang spec.

    For ``hf``, pass the trainer's ``model`` to share its weights in process (loaded from the
    spec when omitted). ``options`` go to the sampler's constructor (e.g. ``batch_size`` or
    ``timeout_s``).
    """
    if spec.kind == "hf":
        from envace_engine.samplers.embedded.sampler import HFSampler

        return HFSampler(
            model if model is not None else load_model(spec),
            tokenizer if tokenizer is not None else load_tokenizer(spec),
            **options,
        )
    if spec.kind == "sglang":
        from envace_engine.samplers.sglang import SGLangSampler

        return SGLangSampler(spec.urls, **options)
    raise ModelError(f"{spec.name}: no sampler for model kind {spec.kind!r} (use hf or sglang)")
