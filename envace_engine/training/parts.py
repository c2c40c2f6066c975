"""The live objects of a training job: what ``trainer.setup`` builds once and the step's
phases (rollout, advantages, ``optimize``, checkpoints) read. Its own module so the phases
depend on it, not on the trainer that drives them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from envace_engine import adapters
from envace_engine.config import TrainConfig
from envace_engine.environments.base import Suite
from envace_engine.rollout.rewards import RewardFn
from envace_engine.samplers import Sampler
from envace_engine.training.parallel import distributed
from envace_engine.training.parallel.weight_sync import WeightSource
from envace_engine.types import Task


@dataclass
class Parts:
    """The live objects of a training job (built once by ``setup``)."""

    config: TrainConfig
    model: Any  # transformers PreTrainedModel: trained in place, or FSDP's full copy (``sharded``)
    ref_model: Any | None  # frozen reference for the KL term (kl_coef > 0); sharded under FSDP
    tokenizer: Any
    optimizer: Any  # torch.optim.AdamW
    sampler: Sampler
    suite: Suite
    tasks: list[Task]
    reward: RewardFn
    success: RewardFn  # state replay on the real env: real-env success
    dist: distributed.Dist
    reward_is_success: bool = False  # the reward *is* the state replay: don't score twice
    # FSDP: the sharded model the optimizer trains (``fsdp.LogprobModule``); ``model`` is then a
    # frozen full copy of it, refreshed after each step, for sampling and checkpoints. None: DDP
    # or one process, where ``model`` itself is trained.
    sharded: Any | None = None
    # ``simulator`` mode: a frozen copy of the starting model, sampled to answer tool calls.
    simulator: Sampler | None = None
    probe_tasks: list[Task] = dataclasses.field(default_factory=list)  # held-out, never trained
    # ``[lora] enabled``: ``model`` is the peft model (frozen base + trained adapter) and this is
    # the plain model with the adapter merged in, which the sampler reads (``adapters``)
    merged: Any | None = None

    def weight_source(self) -> WeightSource:
        """What a weight push to out-of-process samplers reads (the full model copy)."""
        if self.merged is None:
            return WeightSource(self.sampler, self.model, self.tokenizer, self.dist)
        return WeightSource(self.sampler, self.merged, self.tokenizer, self.dist, self.model)

    def refresh_merged(self) -> None:
        """After the adapter changed: rewrite the merged copy the sampler reads."""
        if self.merged is not None:
            adapters.refresh(self.model, self.merged)
