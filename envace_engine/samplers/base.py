"""The ``Sampler`` protocol: token-id prompts in; token ids, log-probs and a finish reason out.

Token-in/token-out: the returned ids and log-probs are the training data, so a sampler must
return exactly what it sampled (including a final stop token) and the log-probs of the sampling
distribution (``log_softmax(logits / temperature)`` before top-k/top-p, as SGLang and TRL do).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings (names follow SGLang's ``sampling_params``)."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 = whole vocabulary
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class Generation:
    """One sampled completion. ``finish_reason``: ``stop`` | ``length`` | ``abort`` | ``error``."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str
    text: str = ""
    error: str = ""  # why, when finish_reason is abort/error

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"generation has {len(self.token_ids)} tokens but {len(self.logprobs)} logprobs"
            )


@runtime_checkable
class Sampler(Protocol):
    """Batched generation from token-id prompts."""

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """One generation per prompt, in order. Failures are returned, not raised."""
        ...
