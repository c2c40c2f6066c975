"""Samplers: token-id prompts in; token ids, log-probs and a finish reason out (docs/samplers.md).

``make_sampler`` builds the right one from a resolved ``ModelSpec``. Implementations are imported
lazily: ``hf`` needs torch, ``sglang`` only httpx, and importing this package needs neither.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from envace_engine.models import ModelError, ModelSpec, load_model, load_tokenizer
from envace_engine.samplers.base import Generation, Sampler, SamplingParams
from envace_engine.samplers.sglang import SGLangSampler

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["Generation", "Sampler", "SamplingParams", "make_sampler"]


def make_sampler(
    spec: ModelSpec,
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    *,
    batch_size: int | None = None,
    dtype: str = "auto",
    **options: Any,
) -> Sampler:
    """``HFSampler`` for a local checkpoint spec, ``SGLangSampler`` for an SGLang spec.

    For ``hf``, pass the trainer's ``model`` to share its weights in process (loaded from the
    spec when omitted); ``batch_size`` (prompts per forward batch) and ``dtype`` (GEMM dtype:
    ``auto`` | ``float32`` | ``bfloat16``) configure it. A server batches by itself
    (``batch_size`` does not apply) and computes in the dtype it was started with, so a
    ``dtype`` other than ``auto`` is an error there. ``options`` go to the sampler's
    constructor (e.g. ``timeout_s``).
    """
    if spec.kind == "hf":
        from envace_engine.samplers.embedded.sampler import HFSampler

        if batch_size is not None:
            options["batch_size"] = batch_size
        return HFSampler(
            model if model is not None else load_model(spec),
            tokenizer if tokenizer is not None else load_tokenizer(spec),
            dtype=dtype,
            **options,
        )
    if spec.kind == "sglang":
        if dtype != "auto":
            raise ModelError(
                f"{spec.name}: dtype {dtype!r} applies to the embedded sampler; an SGLang server "
                "computes in the dtype it was started with (its --dtype): leave the dtype at auto"
            )
        return SGLangSampler(spec.urls, **options)
    raise ModelError(f"{spec.name}: no sampler for model kind {spec.kind!r} (use hf or sglang)")
