"""The sampler `envace eval` and `envace sweep` build: the study's evaluation settings."""

from __future__ import annotations

from envace_engine.cli.eval import _checkpoints
from envace_engine.config import EVAL_CACHE_TOKENS
from envace_engine.samplers.embedded.sampler import HFSampler


def test_an_embedded_evaluation_sampler_holds_its_cache_during_rollouts(tiny_path):
    (checkpoint,) = _checkpoints(["tiny"], 5, "auto")
    sampler = checkpoint.sampler
    assert isinstance(sampler, HFSampler)
    assert sampler.batch_size == 5  # --batch-size reaches the sampler
    # Bounded between calls and during them (an unbounded evaluation grew to 20.5 GB resident).
    assert sampler.cache.max_tokens == EVAL_CACHE_TOKENS
    assert sampler.call_cache_tokens == EVAL_CACHE_TOKENS
