"""transformers' own continuous batching behind our ``SessionSampler`` protocol (the library
baseline of ``bench/rollout_throughput.py``).

``model.continuous_batching_context_manager`` runs transformers' paged-attention scheduler in a
background thread; requests join it one at a time (``add_request``, with their own token cap
and stop ids) and finished ones come back from ``get_result``: the same shape as our
``DecodeSession``, so ``rollout()`` drives both through one code path. Its log-probs are the
library's (``return_logprobs``); the bench compares throughput, not sampling conventions.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any

from envace_engine.samplers.base import Generation, SamplingParams


@dataclass
class LibrarySession:
    """One open transformers ``ContinuousBatchingManager``, as a ``Session``."""

    manager: Any
    keys: dict[str, Hashable] = field(default_factory=dict)
    stops: dict[str, frozenset[int]] = field(default_factory=dict)
    ids: Iterator[int] = field(default_factory=itertools.count)

    @property
    def busy(self) -> bool:
        """Whether a submitted request has not come back yet."""
        return bool(self.keys)

    def submit(
        self, key: Hashable, prompt: list[int], max_new_tokens: int, stop_ids: frozenset[int]
    ) -> None:
        """Queue one request with its own cap and stop ids."""
        rid = f"r{next(self.ids)}"
        self.keys[rid], self.stops[rid] = key, stop_ids
        eos = sorted(stop_ids) if stop_ids else [-1]  # -1: no stop token (ignore-EOS workload)
        self.manager.add_request(
            list(prompt), request_id=rid, max_new_tokens=max_new_tokens, eos_token_id=eos
        )

    def step(self) -> list[tuple[Hashable, Generation]]:
        """Wait for the next finished request, then take every other one already done."""
        done: list[tuple[Hashable, Generation]] = []
        timeout: float | None = 30.0
        while self.keys:
            result = self.manager.get_result(timeout=timeout)
            if result is None:
                if not self.manager.is_running():
                    raise RuntimeError("transformers' continuous batching thread stopped")
                if done or timeout == 0:
                    break
                continue
            if not result.is_finished():
                continue
            done.append(self._finished(result))
            timeout = 0  # drain what is ready without waiting again
        return done

    def _finished(self, result: Any) -> tuple[Hashable, Generation]:
        key, stops = self.keys.pop(result.request_id), self.stops.pop(result.request_id)
        tokens = tuple(result.generated_tokens)
        logprobs = tuple(float(x) for x in result.logprobs[: len(tokens)])
        if len(logprobs) < len(tokens):  # no log-prob for a token: the bench does not train
            logprobs += (0.0,) * (len(tokens) - len(logprobs))
        if result.error:
            return key, Generation(tokens, logprobs, "error", error=str(result.error))
        reason = "stop" if tokens and tokens[-1] in stops else "length"
        return key, Generation(tokens, logprobs, reason)


@dataclass
class LibrarySampler:
    """A ``SessionSampler`` over ``model.continuous_batching_context_manager``.

    ``settings``: ``ContinuousBatchingConfig`` fields (the bench tries a few and keeps the
    fastest); ``attn``: the paged attention implementation the model switches to.
    """

    model: Any
    tokenizer: Any
    settings: dict[str, Any] = field(default_factory=dict)
    attn: str = "sdpa"

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """One generation per prompt, in order, through a session."""
        out: dict[int, Generation] = {}
        stops = frozenset(params.stop_token_ids)
        with self.session(params) as s:
            for i, p in enumerate(prompts):
                s.submit(i, p, params.max_new_tokens, stops)
            while s.busy:
                out.update((int(k), g) for k, g in s.step())  # type: ignore[call-overload]
        return [out[i] for i in range(len(prompts))]

    @contextlib.contextmanager
    def session(self, params: SamplingParams) -> Iterator[LibrarySession]:
        """A running manager sampling at ``params``' temperature, top-k and top-p."""
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        sample = params.temperature > 0
        gen = GenerationConfig(
            do_sample=sample,
            temperature=params.temperature if sample else None,
            top_k=params.top_k if params.top_k > 0 else None,
            top_p=params.top_p if params.top_p < 1 else None,
            max_new_tokens=params.max_new_tokens,
            eos_token_id=-1,
            pad_token_id=self.tokenizer.pad_token_id or 0,
        )
        config = ContinuousBatchingConfig(
            return_logprobs=True, seed=params.seed, auto_switch_to_flash=False, **self.settings
        )
        if self.model.config._attn_implementation != self.attn:
            self.model.set_attn_implementation(self.attn)
        manager = self.model.continuous_batching_context_manager(
            generation_config=gen, continuous_batching_config=config, warmup=False
        )
        with manager as m:
            yield LibrarySession(m)
