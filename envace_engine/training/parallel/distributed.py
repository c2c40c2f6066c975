"""Data-parallel training across processes (``torchrun`` / ``accelerate launch``), CPU or GPU.

Each rank rolls out its own share of the step's tasks (whole GRPO groups, so advantages never
need another rank's rewards), computes its loss over its own micro-batches, and the gradients
are averaged across ranks before the optimizer step; every rank then holds identical weights.

Why an explicit gradient all-reduce rather than wrapping the model in
``DistributedDataParallel``: ranks get different numbers of micro-batches (episode lengths
differ), and DDP all-reduces on *every* backward, so ranks with different counts would deadlock;
and the loss calls the backbone directly (``logprobs.completion_logprobs`` bypasses the LM head
of ``forward``), which DDP's forward hooks would not see. One bucketed all-reduce after the
last micro-batch is what DDP does with ``no_sync`` plus a final sync, without either problem.

That is ``[distributed] strategy = "ddp"`` (the default). ``"fsdp"`` shards parameters,
gradients and optimizer state with FSDP2 instead (``parallel.fsdp``); the helpers here
(``most``, ``device``) serve both.

The process group comes from the launcher's environment (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``, ``LOCAL_RANK``): gloo on CPU, NCCL on GPU, where each rank
trains on GPU ``LOCAL_RANK``. A single process needs nothing and trains on the CPU.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Dist:
    """This process's place in the job: ``rank`` of ``world_size`` (1 = not distributed)."""

    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        """Rank 0 writes the sink and the checkpoints."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        """Whether collectives are needed at all."""
        return self.world_size > 1


def init() -> Dist:
    """Join the launcher's process group (if any) and return this rank's place."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":  # NCCL collectives run on this rank's own GPU
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend=backend)
    return Dist(rank=dist.get_rank(), world_size=dist.get_world_size())


def device(d: Dist) -> torch.device:
    """Where this rank trains: its GPU when the process group is NCCL, else the CPU.

    NCCL only moves CUDA tensors, so under NCCL the model must live on the GPU; one process
    (no process group) trains on the CPU, as before distributed training existed.
    """
    import torch
    import torch.distributed as dist

    if d.enabled and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def shutdown(d: Dist) -> None:
    """Leave the process group (after a barrier, so no rank exits mid-collective)."""
    if d.enabled:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


def average_gradients(params: Iterable[torch.nn.Parameter], d: Dist) -> None:
    """Replace each gradient by its mean over ranks (a missing gradient counts as zeros)."""
    if not d.enabled:
        return
    import torch
    import torch.distributed as dist

    grads = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    flat = torch.cat([g.reshape(-1) for g in grads])  # one collective instead of one per tensor
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= d.world_size
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def broadcast_parameters(params: Iterable[torch.nn.Parameter], d: Dist) -> None:
    """Copy rank 0's weights to every rank, so all ranks start from the same point."""
    if not d.enabled:
        return
    import torch.distributed as dist

    for p in params:
        dist.broadcast(p.data, src=0)


def total(value: float, d: Dist) -> float:
    """The sum of ``value`` over ranks."""
    if not d.enabled:
        return value
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(value)], dtype=torch.float64, device=device(d))  # NCCL: on GPU
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t.item())


def most(value: int, d: Dist) -> int:
    """The largest ``value`` over ranks (e.g. micro-batches this step, so all run as many)."""
    if not d.enabled:
        return value
    import torch
    import torch.distributed as dist

    t = torch.tensor([int(value)], dtype=torch.int64, device=device(d))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def gather(obj: Any, d: Dist) -> list[Any]:
    """Every rank's ``obj`` on rank 0 (in rank order); other ranks get ``[]``."""
    if not d.enabled:
        return [obj]
    import torch.distributed as dist

    out: list[Any] | None = [None] * d.world_size if d.is_main else None
    dist.gather_object(obj, out, dst=0)
    return list(out) if out is not None else []


def share(obj: Any, d: Dist) -> Any:
    """Rank 0's ``obj`` on every rank (e.g. a run id chosen by rank 0)."""
    if not d.enabled:
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(d: Dist) -> None:
    """Wait for every rank (e.g. until rank 0 has written a checkpoint)."""
    if d.enabled:
        import torch.distributed as dist

        dist.barrier()
