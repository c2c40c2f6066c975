"""The ``Sampler`` protocol: token-id prompts in; token ids, log-probs and a finish reason out.

Token-in/token-out: the returned ids and log-probs are the training data, so a sampler must
return exactly what it sampled (including a final stop token) and the log-probs of the sampling
distribution (``log_softmax(logits / temperature)`` before top-k/top-p, as SGLang and TRL do).
"""

from __future__ import annotations

from collections.abc import Hashable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
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


class Session(Protocol):
    """Continuous submission: requests go in one at a time, finished generations come out.

    ``HFSampler``'s continuous batching (``embedded.session.DecodeSession``) and SGLang's
    concurrent requests (``sglang.SGLangSession``) implement it. ``step`` does some work (one
    decode step, or one wait for the server) and returns the generations that finished, each
    under the key it was submitted with.
    """

    @property
    def busy(self) -> bool:
        """Whether any submitted request has not come out of ``step`` yet."""
        ...

    def submit(
        self, key: Hashable, prompt: list[int], max_new_tokens: int, stop_ids: frozenset[int]
    ) -> None:
        """Queue one request (its own token cap and stop ids; the session's sampling params)."""
        ...

    def step(self) -> list[tuple[Hashable, Generation]]:
        """Advance; return the ``(key, generation)`` pairs that finished."""
        ...


@runtime_checkable
class SessionSampler(Sampler, Protocol):
    """A sampler that can also run a ``Session`` (the rollout then never waits for a batch)."""

    def session(self, params: SamplingParams) -> AbstractContextManager[Session]:
        """A session sampling with ``params`` (temperature, top-k/p, seed) until it closes."""
        ...


@runtime_checkable
class TokenCounting(Protocol):
    """A sampler that counts the tokens it has generated (progress bars show tok/s from it)."""

    @property
    def generated(self) -> int:
        """Tokens generated so far (read-only to its readers)."""
        ...


@runtime_checkable
class CacheHolding(Protocol):
    """A sampler that keeps computed K/V between calls (an in-process prefix cache).

    The trainer drops it before an optimizer step: the update makes it stale, and on a CPU the
    cache (up to ``prefix_cache_tokens`` of K/V, about 3 GB for the 135M model) would otherwise
    sit beside the training step's activations at the step's memory peak.
    """

    def drop_cache(self) -> None:
        """Release every K/V the sampler keeps between calls."""
        ...


@runtime_checkable
class WeightReceiver(Protocol):
    """A sampler in other processes that loads new weights from a checkpoint directory.

    In-process samplers share the trained model object and need no push; SGLang servers are
    told to load each step's weights (``training.parallel.weight_sync``).
    """

    def update_weights_from_disk(
        self, model_path: str | Path, *, weight_version: str | None = None
    ) -> None:
        """Make every server load ``model_path`` as ``weight_version``; raise if any refuses."""
        ...


@runtime_checkable
class AdapterReceiver(Protocol):
    """A sampler in other processes that serves LoRA adapters on its base model (SGLang's
    ``--enable-lora``): a LoRA run pushes only the adapter each step
    (``training.parallel.weight_sync``)."""

    lora_name: str | None  # the adapter requests name now (None: the base model)

    def load_lora_adapter(self, name: str, path: str | Path) -> None:
        """Make every server load the adapter directory ``path`` under ``name``; raise if any
        refuses."""
        ...

    def unload_lora_adapter(self, name: str) -> None:
        """Make every server drop adapter ``name``; raise if any refuses."""
        ...

    def use_lora_adapter(self, name: str | None) -> None:
        """Sample from adapter ``name`` from now on (None: the base model)."""
        ...
