"""Role-wise GRPO loss: clipped policy gradient, dual clip, optional k3 KL (docs/method.md §4).

Per trained token ``t`` of a row with advantage ``A``, with ``r = exp(logp − old_logp)``::

    surr  = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high))        # = −min(A·r, A·clip(r)), PPO
    dual  = min(surr, −c·A)   if A < 0   else surr               # dual clip (Ye et al. 2020)
    kl    = exp(ref − logp) − (ref − logp) − 1                   # k3 estimator, >= 0
    loss_t = w · dual + (kl_coef + world_kl_coef·[row is rehearse]) · kl

``world_kl_coef`` anchors the world role alone to the reference (the checkpoint training
started from): the agent may move away from it while the world role's answers stay close.

``w`` is 1 unless truncated importance sampling is on (``is_weights``: per-token
``min(p_trainer / p_sampler, C)``, detached; the ratio's ``old_logp`` is then the trainer's own),
which corrects for a sampler whose numerics differ from the trainer's as TRL's
``vllm_importance_sampling_mode="token_truncate"`` does (Yao et al. 2025).

The dual clip bounds the loss of a negative-advantage token at ``c·|A|`` when its ratio has grown
past ``c``: without it a stale, very unlikely-then-likely token could dominate the step.
No entropy bonus. TRL's GRPO has no dual clip; with ``dual_clip=None`` this is exactly TRL's
clipped surrogate (``use_bias_correction_kl=False`` for the KL term), see
tests/test_loss_trl_equality.py.

Aggregation over the trained tokens (mask):

* ``seq_mean_token_mean`` (EnvACE, TRL ``grpo``): mean over each row's tokens, then over rows;
* ``token_mean`` (TRL ``bnpo``): one mean over all tokens of the batch.

For micro-batches, pass ``total_rows`` / ``total_tokens`` of the whole step: the divisor becomes
that total, and the micro-batch losses sum to the full-batch loss (gradient accumulation).
An all-zero mask gives a loss of exactly 0 (connected to the graph), never NaN.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from envace_engine.training.batching import TRAINED_ROLES
from envace_engine.types import Role

if TYPE_CHECKING:
    import torch

    from envace_engine.training.batching import Batch

Aggregation = Literal["seq_mean_token_mean", "token_mean"]


@dataclass(frozen=True)
class LossInputs:
    """Per-token tensors ``[B, T]`` (aligned with each other) and per-row ``[B]`` tensors."""

    logprobs: torch.Tensor  # [B, T] current policy, differentiable
    old_logprobs: torch.Tensor  # [B, T] the sampler's log-probs of the same tokens
    advantages: torch.Tensor  # [B]
    mask: torch.Tensor  # [B, T] 1 on trained tokens, 0 elsewhere
    role_ids: torch.Tensor  # [B] index into batching.TRAINED_ROLES
    ref_logprobs: torch.Tensor | None = None  # [B, T] frozen reference, needed when kl_coef > 0
    is_weights: torch.Tensor | None = None  # [B, T] truncated importance weights (no gradient)

    @classmethod
    def from_batch(
        cls, batch: Batch, logprobs: torch.Tensor, ref_logprobs: torch.Tensor | None = None
    ) -> LossInputs:
        """Pair a collated batch with the policy's (and reference's) ``[B, L]`` log-probs for
        it, as per-row ``[R, C]`` tensors (``Batch.rows_view``: one row per training row, also
        when several rows share one packed sequence)."""
        return cls(
            logprobs=batch.rows_view(logprobs),
            old_logprobs=batch.rows_view(batch.old_logprobs),
            advantages=batch.advantages,
            mask=batch.row_mask,
            role_ids=batch.role_ids,
            ref_logprobs=None if ref_logprobs is None else batch.rows_view(ref_logprobs),
        )


@dataclass(frozen=True)
class RoleMetrics:
    """Sums over one role's trained tokens; add two to merge micro-batches."""

    rows: int = 0
    tokens: int = 0
    loss_sum: float = 0.0  # sum of per-token losses (incl. KL term)
    clipped: int = 0  # tokens whose PPO clip is active (zero gradient)
    dual_clipped: int = 0  # negative-advantage tokens bounded by the dual clip
    kl_sum: float = 0.0  # sum of per-token k3 KL (0 without a reference)

    def __add__(self, other: RoleMetrics) -> RoleMetrics:
        return RoleMetrics(
            rows=self.rows + other.rows,
            tokens=self.tokens + other.tokens,
            loss_sum=self.loss_sum + other.loss_sum,
            clipped=self.clipped + other.clipped,
            dual_clipped=self.dual_clipped + other.dual_clipped,
            kl_sum=self.kl_sum + other.kl_sum,
        )

    @property
    def loss(self) -> float:
        """Token-mean loss of this role (whatever the batch aggregation)."""
        return self.loss_sum / max(self.tokens, 1)

    @property
    def clip_frac(self) -> float:
        """Fraction of this role's tokens with an active PPO clip."""
        return self.clipped / max(self.tokens, 1)

    @property
    def dual_clip_frac(self) -> float:
        """Fraction of this role's tokens bounded by the dual clip."""
        return self.dual_clipped / max(self.tokens, 1)

    @property
    def kl(self) -> float:
        """Token-mean k3 KL to the reference."""
        return self.kl_sum / max(self.tokens, 1)


@dataclass(frozen=True)
class LossOutputs:
    """The scalar to backpropagate and per-role metrics (keys: ``act``, ``rehearse``)."""

    loss: torch.Tensor
    roles: dict[str, RoleMetrics] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """Flat names for a sink, e.g. ``loss/act``, ``clip_frac/rehearse``, ``tokens/act``."""
        out: dict[str, float] = {}
        for role, m in self.roles.items():
            out[f"tokens/{role}"] = float(m.tokens)
            out[f"rows/{role}"] = float(m.rows)
            out[f"loss/{role}"] = m.loss
            out[f"clip_frac/{role}"] = m.clip_frac
            out[f"dual_clip_frac/{role}"] = m.dual_clip_frac
            out[f"kl/{role}"] = m.kl
        return out


def policy_loss(
    inputs: LossInputs,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float | None = None,
    dual_clip: float | None = 3.0,
    kl_coef: float = 0.0,
    aggregation: Aggregation = "seq_mean_token_mean",
    total_rows: int | None = None,
    total_tokens: int | None = None,
    world_kl_coef: float = 0.0,
) -> LossOutputs:
    """The clipped policy-gradient loss of the module docstring, with per-role metrics.

    ``clip_eps_high`` defaults to ``clip_eps_low``; ``dual_clip=None`` turns the dual clip off.
    """
    import torch

    eps_high = clip_eps_low if clip_eps_high is None else clip_eps_high
    _check_args(inputs, clip_eps_low, eps_high, dual_clip, kl_coef + world_kl_coef, aggregation)
    if world_kl_coef < 0:
        raise ValueError(f"world_kl_coef must be >= 0, got {world_kl_coef}")
    mask = inputs.mask.to(inputs.logprobs.dtype)
    on = mask > 0
    # Off-mask positions may hold anything (padding): zero their log-ratio so exp() cannot
    # overflow there and turn a 0 x inf product into a NaN gradient.
    log_ratio = torch.where(on, inputs.logprobs - inputs.old_logprobs, 0.0)
    ratio = torch.exp(log_ratio)
    adv = inputs.advantages.to(ratio.dtype).unsqueeze(1)
    surr = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip_eps_low, 1 + eps_high))
    if dual_clip is not None:
        surr = torch.where(adv < 0, torch.minimum(surr, -dual_clip * adv), surr)
    per_token = surr if inputs.is_weights is None else surr * inputs.is_weights.detach()
    kl = None
    if inputs.ref_logprobs is not None:
        delta = torch.where(on, inputs.ref_logprobs - inputs.logprobs, 0.0)
        kl = torch.exp(delta) - delta - 1
        if kl_coef or world_kl_coef:
            rehearse = (inputs.role_ids == TRAINED_ROLES.index(Role.REHEARSE)).to(kl.dtype)
            coef = kl_coef + world_kl_coef * rehearse.unsqueeze(1)
            per_token = per_token + coef * kl
    masked = per_token * mask
    if aggregation == "seq_mean_token_mean":
        rows = total_rows if total_rows is not None else mask.shape[0]
        loss = (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).sum() / max(rows, 1)
    else:
        tokens = total_tokens if total_tokens is not None else mask.sum().item()
        loss = masked.sum() / max(tokens, 1.0)
    with torch.no_grad():
        clipped = ((adv > 0) & (ratio > 1 + eps_high)) | ((adv < 0) & (ratio < 1 - clip_eps_low))
        dual = (adv < 0) & (ratio > dual_clip) if dual_clip is not None else torch.zeros_like(on)
        roles = _role_metrics(inputs.role_ids, on, per_token, clipped, dual, kl)
    return LossOutputs(loss=loss, roles=roles)


def _role_metrics(
    role_ids: torch.Tensor,
    on: torch.Tensor,
    per_token: torch.Tensor,
    clipped: torch.Tensor,
    dual: torch.Tensor,
    kl: torch.Tensor | None,
) -> dict[str, RoleMetrics]:
    roles: dict[str, RoleMetrics] = {}
    for index, role in enumerate(TRAINED_ROLES):
        in_role = on & (role_ids == index).unsqueeze(1)
        roles[str(role)] = RoleMetrics(
            rows=int((role_ids == index).sum().item()),
            tokens=int(in_role.sum().item()),
            loss_sum=float(per_token[in_role].sum().item()),
            clipped=int((clipped & in_role).sum().item()),
            dual_clipped=int((dual & in_role).sum().item()),
            kl_sum=float(kl[in_role].sum().item()) if kl is not None else 0.0,
        )
    return roles


def _check_args(
    inputs: LossInputs,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None,
    kl_coef: float,
    aggregation: str,
) -> None:
    shape = inputs.logprobs.shape
    for name in ("old_logprobs", "mask", "ref_logprobs"):
        tensor = getattr(inputs, name)
        if tensor is not None and tensor.shape != shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, logprobs {tuple(shape)}")
    for name in ("advantages", "role_ids"):
        if tuple(getattr(inputs, name).shape) != (shape[0],):
            raise ValueError(f"{name} must have one value per row: shape ({shape[0]},)")
    if not (0 <= eps_low < 1 and eps_high >= 0):
        raise ValueError(f"clip eps must satisfy 0 <= low < 1 and high >= 0: {eps_low}, {eps_high}")
    if dual_clip is not None and dual_clip <= 1:
        raise ValueError(f"dual_clip must be > 1 (EnvACE uses 3) or None to disable: {dual_clip}")
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    if kl_coef > 0 and inputs.ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs from the frozen reference model")
    if aggregation not in ("seq_mean_token_mean", "token_mean"):
        raise ValueError(
            f"aggregation must be 'seq_mean_token_mean' or 'token_mean', got {aggregation!r}"
        )
