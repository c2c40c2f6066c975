"""Request validation shared by every sampler.

A bad prompt or sampling setting is a programmer error, not a failed rollout: it fails loudly
with a message that names the field and the accepted range, before any compute or HTTP call.
(SGLang would answer 400 for the same inputs; failing here keeps the message local and clear.)
"""

from __future__ import annotations

import math

from envace_engine.samplers.base import SamplingParams

GREEDY_BELOW = 1e-6  # SGLang treats temperature in [0, 1e-6) as greedy decoding


def is_greedy(params: SamplingParams) -> bool:
    """Whether ``params`` asks for greedy decoding (SGLang's convention: temperature < 1e-6)."""
    return params.temperature < GREEDY_BELOW


def check_request(prompts: list[list[int]], params: SamplingParams) -> None:
    """Raise ``ValueError`` naming the first invalid prompt or sampling field."""
    if params.max_new_tokens < 0:
        raise ValueError(
            f"max_new_tokens={params.max_new_tokens} is negative: use 0 or more new tokens"
        )
    if not math.isfinite(params.temperature) or params.temperature < 0:
        raise ValueError(
            f"temperature={params.temperature} is invalid: use a finite value >= 0 (0 = greedy)"
        )
    if not 0 < params.top_p <= 1:
        raise ValueError(f"top_p={params.top_p} is outside (0, 1]: use e.g. 1.0 for no cut")
    if params.top_k == 0 or params.top_k < -1:
        raise ValueError(f"top_k={params.top_k} is invalid: use -1 (whole vocabulary) or k >= 1")
    for index, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"prompt {index} is empty: every prompt needs at least one token id")
