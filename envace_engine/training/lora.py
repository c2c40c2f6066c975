"""The model a training job optimizes: every weight, or a LoRA adapter over a frozen base."""

from __future__ import annotations

from typing import Any

from envace_engine import adapters
from envace_engine.config import LoraSettings
from envace_engine.models import ModelSpec, load_model


def trained_model(
    spec: ModelSpec, lora: LoraSettings, sampled: bool = True
) -> tuple[Any, Any | None]:
    """(the model the optimizer trains, the merged copy the sampler reads or None).

    Full fine-tuning trains ``spec``'s weights (an adapter in ``spec`` merged in). With
    ``lora.enabled`` the base is frozen under an adapter (``spec``'s own, continued, or a fresh
    one) and, when the job samples from it (``sampled``; SFT does not), a second copy of the
    base holds the merged weights for sampling.
    """
    if not lora.enabled:
        return load_model(spec), None
    base = spec.without_adapter()
    model = adapters.attach(load_model(base), lora, spec.base_name, start=spec.adapter)
    if not sampled:
        return model, None
    merged = load_model(base).requires_grad_(False)
    adapters.refresh(model, merged)
    return model, merged
