"""FSDP2 (``fully_shard``) for the trainer: ``[distributed] strategy = "fsdp"``.

Parameters, gradients and AdamW state are sharded on dim 0 over the ranks, one FSDP unit per
decoder layer plus a root unit for the rest (embeddings = tied LM head, final norm). Before a
unit runs, its parameters are all-gathered; after it, they are freed again; each backward
reduce-scatters (and averages) the gradients into the shards. That works on GPU with NCCL and on
CPU with gloo: torch 2.13's gloo implements both collectives FSDP2 needs
(``all_gather_into_tensor``, ``reduce_scatter_tensor``), checked by tests/test_fsdp.py.

The traps, and how this module meets them:

(a) **Which modules run.** FSDP's unshard/reshard hooks are forward hooks on the FSDP modules,
    but our loss calls ``model.base_model`` and then reads ``get_output_embeddings().weight``
    directly (``logprobs.completion_logprobs`` never runs the model's own ``forward``). If the
    root unit were the HF model, its hooks would never fire and the embeddings and LM head would
    stay sharded DTensors. So the root is ``LogprobModule``, whose ``forward`` *is*
    ``completion_logprobs``: calling it unshards the root's parameters (embeddings = tied head,
    final norm) for the whole computation, the decoder layers' own hooks fire inside, and the
    backward's reduce-scatter runs for every unit. Always score through ``score``.
(b) **Uneven micro-batch counts.** Every FSDP forward and backward is a collective, so every
    rank must run the same number of them; ranks agree on the maximum count and the short ones
    run ``padding_step`` (a real forward/backward with weight 0: zero gradient, same collectives).
(c) **Sampling.** The in-process sampler decodes token by token, a different number of steps on
    each rank; on a sharded model every step would be an all-gather that the other ranks never
    join. So each rank also keeps a plain, frozen, *full* copy of the model, which the sampler,
    the checkpoint writer and the SGLang weight push use; ``gather_weights`` refreshes it from
    the shards after every optimizer step (one all-gather per parameter). The shards still save
    what FSDP is for: gradients and the two AdamW moments (3/4 of fp32 training state) live once
    over all ranks instead of once per rank.
(d) **Checkpoints.** ``full_optimizer_state`` gathers the AdamW state into exactly the format of a
    plain ``optimizer.state_dict()`` (integer ids in parameter order, full tensors), the weights
    come from the full copy, so an FSDP checkpoint is byte-compatible with a DDP or single-process
    one; ``load_weights`` / ``shard_optimizer_state`` cut a full checkpoint back into this rank's
    shards (no communication: every rank reads the file). A run resumes with either strategy.
(e) **Grad clipping.** ``clip_grad_norm_`` on DTensor gradients returns the global norm as a
    (replicated) DTensor; ``norm_value`` turns it into a float.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from envace_engine.logprobs import completion_logprobs
from envace_engine.training.parallel import distributed

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class LogprobModule(torch.nn.Module):
    """The FSDP root: ``forward`` computes ``completion_logprobs(lm, ...)``, inside FSDP's hooks."""

    def __init__(self, lm: PreTrainedModel) -> None:
        super().__init__()
        self.lm = lm

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        completion_mask: torch.Tensor,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """Log-probs ``[B, L]`` of the completion tokens (see ``logprobs.completion_logprobs``)."""
        return completion_logprobs(
            self.lm, input_ids, attention_mask, completion_mask, temperature=temperature
        )


def score(
    module: PreTrainedModel | LogprobModule,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
    prefix_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Completion log-probs of a plain HF model or of a sharded ``LogprobModule`` (trap a).

    ``prefix_ids`` (a shared prompt prefix, ``batching.collate(share_prefix=True)``) only for a
    plain model: a sharded one runs each micro-batch as one forward through its FSDP root.
    """
    if isinstance(module, LogprobModule):
        if prefix_ids is not None and prefix_ids.numel():
            raise ValueError("a sharded model takes whole rows: build batches without a prefix")
        return module(input_ids, attention_mask, completion_mask, temperature)
    return completion_logprobs(
        module,
        input_ids,
        attention_mask,
        completion_mask,
        temperature=temperature,
        prefix_ids=prefix_ids,
    )


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of a causal LM (``model.base_model.layers``), each one FSDP unit."""
    layers = getattr(getattr(model, "base_model", None), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) == 0:
        raise ValueError(
            f"{type(model).__name__} has no decoder layers at base_model.layers, which FSDP "
            "shards one unit each: use a Llama/Qwen/SmolLM-style model or set "
            "distributed.strategy = 'ddp'"
        )
    return list(layers)


@functools.cache
def _mesh(device_type: str, world_size: int) -> Any:
    return init_device_mesh(device_type, (world_size,))


def shard(model: PreTrainedModel, d: distributed.Dist, *, frozen: bool = False) -> LogprobModule:
    """Shard ``model`` in place over all ranks and return its ``LogprobModule`` root.

    Each decoder layer is one unit, the root holds the rest. ``frozen`` (the KL reference, never
    backpropagated) also reshards the root after each forward; a trained root stays gathered
    between forward and backward, which would otherwise all-gather it again at once.
    """

    if not d.enabled:
        raise ValueError("FSDP needs a process group: launch with torchrun --nproc_per_node N")
    mesh = _mesh(distributed.device(d).type, d.world_size)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    root = LogprobModule(model)
    fully_shard(root, mesh=mesh, reshard_after_forward=True if frozen else None)
    return root


def prepare(
    model: PreTrainedModel, ref: PreTrainedModel | None, d: distributed.Dist, full_device: Any
) -> tuple[PreTrainedModel, LogprobModule, LogprobModule | None]:
    """(full frozen copy on ``full_device``, sharded trained model, sharded reference or None).

    The trained model is a sharded deep copy of ``model`` (tied weights stay tied); ``model``
    itself becomes the full copy for sampling and checkpoints (trap c). It is then filled from
    the shards, so every rank's copy is identical whatever each rank loaded (the replacement
    for DDP's initial broadcast).
    """

    sharded = shard(copy.deepcopy(model), d)
    full = model.to(full_device).requires_grad_(False)
    gather_weights(sharded, full)
    ref_sharded = shard(ref, d, frozen=True) if ref is not None else None
    return full, sharded, ref_sharded


def _pairs(sharded: LogprobModule, full: torch.nn.Module) -> list[tuple[Any, torch.nn.Parameter]]:
    """(shard, full parameter) by name; the two models must be the same architecture."""
    mine = dict(sharded.lm.named_parameters())
    theirs = dict(full.named_parameters())
    if mine.keys() != theirs.keys():
        odd = sorted(mine.keys() ^ theirs.keys())[:3]
        raise ValueError(f"sharded and full model differ in parameters {odd}: same model needed")
    return [(mine[name], theirs[name]) for name in mine]


@torch.no_grad()
def gather_weights(sharded: LogprobModule, full: torch.nn.Module) -> None:
    """Copy the sharded weights into every rank's full copy (a collective: all ranks call it)."""
    for shard_param, full_param in _pairs(sharded, full):
        full_param.copy_(shard_param.full_tensor())


@torch.no_grad()
def load_weights(sharded: LogprobModule, full: torch.nn.Module) -> None:
    """Cut the full copy's weights into this rank's shards (local: no communication)."""
    for shard_param, full_param in _pairs(sharded, full):
        shard_param.copy_(_shard_like(full_param.detach(), shard_param))


def _shard_like(value: torch.Tensor, param: Any) -> Any:
    """``value`` (a full tensor shaped like ``param``) as this rank's shard of it."""

    local = value.to(param.device)
    # src_data_rank=None: every rank holds the full value, so each keeps its chunk, no scatter.
    return distribute_tensor(local, param.device_mesh, param.placements, src_data_rank=None)


def full_optimizer_state(optimizer: torch.optim.Optimizer, keep: bool) -> dict[str, Any] | None:
    """The optimizer state with full tensors, as a plain ``state_dict()`` (a collective).

    Every rank must call it (each sharded tensor is all-gathered, in the same order everywhere);
    only a rank with ``keep`` (the one that writes the checkpoint) builds the dict, on the CPU,
    the others drop each gathered tensor at once and get ``None``.
    """

    sd = optimizer.state_dict()
    state: dict[int, dict[str, Any]] = {}
    for pid in sorted(sd["state"]):
        entry = {}
        for key in sorted(sd["state"][pid]):
            value = sd["state"][pid][key]
            if isinstance(value, DTensor):
                value = value.full_tensor().cpu()
            entry[key] = value
        if keep:
            state[pid] = entry
    return {"state": state, "param_groups": sd["param_groups"]} if keep else None


def shard_optimizer_state(
    full_state: Mapping[str, Any], optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """A full ``state_dict()`` (any strategy's checkpoint) cut to this optimizer's shards."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    saved = sum(len(g["params"]) for g in full_state["param_groups"])
    if saved != len(params):
        raise ValueError(
            f"the checkpoint's optimizer has {saved} parameters, this model {len(params)}: "
            "resume with the run's own model"
        )
    state = {}
    for pid, entry in full_state["state"].items():
        param = params[int(pid)]
        state[pid] = {
            key: _shard_like(v, param) if _is_full_of(v, param) else v for key, v in entry.items()
        }
    return {"state": state, "param_groups": full_state["param_groups"]}


def _is_full_of(value: Any, param: Any) -> bool:
    """Whether ``value`` is a per-element state tensor (AdamW moments) of sharded ``param``."""

    return (
        isinstance(param, DTensor)
        and isinstance(value, torch.Tensor)
        and not isinstance(value, DTensor)
        and value.shape == param.shape
    )


def norm_value(norm: torch.Tensor) -> float:
    """The float of ``clip_grad_norm_``'s result, a DTensor when the gradients are sharded."""

    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)


def padding_step(
    policy: LogprobModule, ref: LogprobModule | None, pad_id: int, device: torch.device
) -> None:
    """One zero-weight micro-batch: the collectives of a real one, exactly zero gradient (trap b).

    The batch is two pad tokens, the second "trained"; the loss is ``0 * sum(log-probs)``, whose
    gradient is zero in every parameter while forward and backward still all-gather and
    reduce-scatter like any micro-batch. The reference model (if any) runs too, because the other
    ranks' real micro-batches run it.
    """
    ids = torch.full((1, 2), pad_id, dtype=torch.long, device=device)
    attention = torch.ones_like(ids)
    completion = torch.tensor([[0.0, 1.0]], device=device)
    logprobs = policy(ids, attention, completion)
    if ref is not None:
        with torch.no_grad():
            ref(ids, attention, completion)
    (logprobs.sum() * 0.0).backward()
