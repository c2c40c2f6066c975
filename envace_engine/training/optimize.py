"""One optimizer step of role-wise GRPO: micro-batches, the loss, gradients, the update.

``optimize`` accumulates gradients over micro-batches (``batching.micro_batches``; with
``share_prefix`` a micro-batch's common prompt prefix runs once), all-reduces them across ranks
(or lets FSDP reduce-scatter them), clips and steps. Rows whose advantage is 0 are not run at all
when there is no KL term: their gradient is exactly zero, and the divisors stay the totals over
all rows, so the gradient equals one big batch's. On the rows it does run, ``micro_step`` also
measures how far the trainer's log-probs are from the sampler's (``Mismatch``): one optimizer
step per rollout batch means both scored the same tokens under the same weights, so the gap is
numerics alone (bf16 GEMMs, another engine). The importance ratio keeps the sampler's log-probs
unless ``loss.tis_cap`` turns on truncated importance sampling (``truncated_is``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from envace_engine.training.batching import micro_batches
from envace_engine.training.loss import LossInputs, RoleMetrics, policy_loss
from envace_engine.training.parallel import distributed, fsdp
from envace_engine.training.parts import Parts
from envace_engine.training.precision import bf16_autocast
from envace_engine.training.world_nll import nll_backward
from envace_engine.types import Role, TrainRow


def optimize(
    parts: Parts,
    rows: list[TrainRow],
    advantages: list[float],
    world_targets: Sequence[TrainRow] = (),
) -> dict[str, float]:
    """Gradient accumulation over micro-batches, all-reduce, clip, one optimizer step.

    Under FSDP each backward reduce-scatters (averages) the gradients into the shards, ranks
    with fewer micro-batches run zero-weight padding ones (``fsdp`` trap b), and the full copy
    the sampler and checkpoints read is refreshed after the step.
    """

    cfg, model, d = parts.config, parts.model, parts.dist
    if distributed.total(len(rows), d) == 0:  # nothing scorable anywhere: every rank skips
        return {"optim/skipped": 1.0}
    trained = _trained(parts)
    parts.optimizer.zero_grad(set_to_none=True)
    trained.train()
    # Without a KL term a row with advantage 0 has exactly zero gradient: skip its forward pass
    # (groups without reward variance are common). The divisors stay the totals over all rows,
    # so the gradient is the same as with every row in the batch.
    live = [(r, a) for r, a in zip(rows, advantages, strict=True) if a != 0 or _anchored(cfg, r)]
    n_rows, n_tokens = len(rows), sum(len(r.completion_ids) for r in rows)
    pad = parts.tokenizer.pad_token_id or 0
    roles: dict[str, RoleMetrics] = {}
    gaps = Mismatch()
    total_loss = 0.0
    batches = []
    if live:
        share = cfg.share_prefix and parts.sharded is None  # FSDP runs whole rows
        batches = micro_batches(
            [r for r, _ in live],
            [a for _, a in live],
            pad,
            cfg.micro_batch_tokens,
            share,
            cfg.pack_episodes,
        )
    padding = _padding_count(parts, len(batches))  # agreed before any FSDP collective runs
    for batch in batches:
        out, gap = micro_step(parts, batch, n_rows, n_tokens)
        gaps += gap
        out.loss.backward()
        total_loss += float(out.loss.item())
        roles = {k: roles.get(k, RoleMetrics()) + v for k, v in out.roles.items()}
    for _ in range(padding):
        assert parts.sharded is not None  # padding is 0 without FSDP (``_padding_count``)
        fsdp.padding_step(parts.sharded, parts.ref_model, pad, _device(trained))
    world = world_nll_step(parts, world_targets)
    if parts.sharded is None:  # FSDP already averaged them, in each backward's reduce-scatter
        # trained parameters only: under [lora] the frozen base has no gradients to average
        distributed.average_gradients([p for p in model.parameters() if p.requires_grad], d)
    clip = cfg.optim.grad_clip if cfg.optim.grad_clip is not None else float("inf")
    # On sharded (DTensor) gradients the norm is the global one, returned as a DTensor.
    grad_norm = fsdp.norm_value(torch.nn.utils.clip_grad_norm_(trained.parameters(), clip))
    parts.optimizer.step()
    trained.eval()
    if parts.sharded is not None:  # the sampler, checkpoints and weight push read the full copy
        fsdp.gather_weights(parts.sharded, model)
    flat = {k: v for r, m in roles.items() for k, v in _role_flat(r, m).items()}
    return {
        "loss": total_loss,
        "grad_norm": grad_norm,
        "optim/skipped": 0.0,
        "optim/micro_batches": float(len(batches)),
        "optim/padding_micro_batches": float(padding),
        "optim/rows_forward": float(len(live)),
        "optim/forward_tokens": float(
            sum(b.input_ids.numel() + b.prefix_ids.numel() for b in batches)
        ),
        **(gaps.metrics() if gaps.tokens else {}),
        **flat,
        **world,
    }


def _anchored(cfg: Any, row: TrainRow) -> bool:
    """Whether a KL term reaches ``row``: then even advantage 0 has a gradient."""
    return bool(cfg.loss.kl_coef or (cfg.loss.world_kl and row.role is Role.REHEARSE))


def world_nll_step(parts: Parts, targets: Sequence[TrainRow]) -> dict[str, float]:
    """The auxiliary world NLL's gradients (``training.world_nll``), under the step's autocast."""

    cfg = parts.config
    if cfg.loss.world_nll == 0:
        return {}
    device = _device(parts.model)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16_autocast(cfg.bf16, device)):
        return nll_backward(
            parts.model,
            targets,
            cfg.loss.world_nll,
            parts.tokenizer.pad_token_id or 0,
            cfg.micro_batch_tokens,
        )


def _trained(parts: Parts) -> Any:
    """The module the optimizer updates: FSDP's sharded root, else the model itself."""
    return parts.sharded if parts.sharded is not None else parts.model


def _device(module: Any) -> Any:
    """The device a module computes on (a sharded parameter reports its local shard's)."""
    return next(module.parameters()).device


def _padding_count(parts: Parts, count: int) -> int:
    """Zero-weight micro-batches this rank adds so every FSDP rank runs as many (trap b).

    At least one in all: with no live row on any rank, the step still applies zero gradients
    to every parameter, as DDP's all-reduce does (AdamW then moves by its momentum only).
    """
    if parts.sharded is None:
        return 0
    return max(distributed.most(count, parts.dist), 1) - count


@dataclass(frozen=True)
class Mismatch:
    """Sums over trained tokens of how far the trainer's log-probs are from the sampler's.

    Both score the same sampled tokens under the same weights (one optimizer step per rollout
    batch, so before the step the policy is the one that sampled): any difference is numerics —
    bf16 vs fp32, batched vs cached attention, another engine (SGLang). ``abs_sum`` sums
    ``|logp_trainer - logp_sampler|``; ``k3_sum`` sums the k3 estimate of KL(sampler || trainer),
    ``exp(d) - d - 1`` with ``d = logp_trainer - logp_sampler`` (>= 0, low variance), computed
    as ``expm1(d) - d`` in float64: in float32 ``exp(d) - d - 1`` rounds to a small negative
    number when |d| is about 1e-6, as an fp32 sampler and trainer give.
    """

    abs_sum: float = 0.0
    k3_sum: float = 0.0
    tokens: int = 0

    def __add__(self, other: Mismatch) -> Mismatch:
        return Mismatch(
            self.abs_sum + other.abs_sum, self.k3_sum + other.k3_sum, self.tokens + other.tokens
        )

    def metrics(self) -> dict[str, float]:
        """``rollout/logprob_diff`` (mean |Δ log-prob|) and ``rollout/mismatch_kl`` (mean k3)."""
        n = max(self.tokens, 1)
        return {"rollout/logprob_diff": self.abs_sum / n, "rollout/mismatch_kl": self.k3_sum / n}


def mismatch(logprobs: Any, old_logprobs: Any, mask: Any) -> Mismatch:
    """``Mismatch`` sums of one micro-batch (``[B, L]`` tensors, ``mask`` 1 on trained tokens)."""

    with torch.no_grad():
        d = ((logprobs.detach() - old_logprobs) * mask).double()
        k3 = (torch.expm1(d) - d) * mask
    return Mismatch(float(d.abs().sum()), float(k3.sum()), int(mask.sum()))


def truncated_is(inputs: LossInputs, cap: float) -> LossInputs:
    """``inputs`` for truncated importance sampling: the ratio's old log-probs become the
    trainer's own (one optimizer step per rollout batch: its current scores, detached), and each
    token is weighted by ``min(exp(logp_trainer - logp_sampler), cap)`` (0 off the mask)."""

    with torch.no_grad():
        trainer = inputs.logprobs.detach()
        on = inputs.mask > 0
        gap = torch.where(on, trainer - inputs.old_logprobs, 0.0)
        weights = torch.exp(gap).clamp(max=cap) * inputs.mask
    return dataclasses.replace(inputs, old_logprobs=trainer, is_weights=weights)


def micro_step(
    parts: Parts, batch: Any, total_rows: int, total_tokens: int
) -> tuple[Any, Mismatch]:
    """The loss of one micro-batch (bf16 autocast when configured), normalised by the totals,
    and how far the trainer's log-probs are from the sampler's on its tokens."""

    cfg = parts.config
    trained = _trained(parts)
    device = _device(trained)
    batch = dataclasses.replace(  # on the model's device (a GPU under NCCL); no-op on the CPU
        batch, **{f.name: getattr(batch, f.name).to(device) for f in dataclasses.fields(batch)}
    )
    args = (batch.input_ids, batch.attention_mask, batch.completion_mask)
    temperature = cfg.rollout.temperature  # old log-probs are of the tempered distribution
    prefix = batch.prefix_ids
    bf16 = bf16_autocast(cfg.bf16, device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        # fsdp.score calls a sharded model through its FSDP root, so the hooks fire (trap a).
        logprobs = fsdp.score(trained, *args, temperature=temperature, prefix_ids=prefix).float()
        ref = None
        if parts.ref_model is not None:
            with torch.no_grad():
                ref_lp = fsdp.score(
                    parts.ref_model, *args, temperature=temperature, prefix_ids=prefix
                )
                ref = ref_lp.float()
    gap = mismatch(logprobs, batch.old_logprobs, batch.completion_mask)
    inputs = LossInputs.from_batch(batch, logprobs, ref)
    if cfg.loss.tis_cap is not None:
        inputs = truncated_is(inputs, cfg.loss.tis_cap)
    out = policy_loss(
        inputs,
        clip_eps_low=cfg.loss.clip_eps_low,
        clip_eps_high=cfg.loss.clip_eps_high,
        dual_clip=cfg.loss.dual_clip,
        kl_coef=cfg.loss.kl_coef,
        world_kl_coef=cfg.loss.world_kl,
        aggregation=cfg.loss.aggregation,
        total_rows=total_rows,
        total_tokens=total_tokens,
    )
    return out, gap


def _role_flat(role: str, m: RoleMetrics) -> dict[str, float]:
    return {
        f"loss/{role}": m.loss,
        f"clip_frac/{role}": m.clip_frac,
        f"kl/{role}": m.kl,
        f"dual_clip_frac/{role}": m.dual_clip_frac,
        f"tokens/{role}": float(m.tokens),
    }
