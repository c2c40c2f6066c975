"""oneDNN-packed copies of a model's linear weights, for the embedded sampler's forwards (CPU).

Why. ``nn.Linear`` on a CPU calls MKL's sgemm, which re-packs the whole weight matrix on every
call. At a sampler's batch sizes (1 to 32 rows in decode, a few hundred in prefill) that packing
is most of the cost: measured on the 2-core AMD EPYC machines, a SmolLM2 MLP projection at 4
rows took 173 us through ``F.linear`` and 57 us from a pre-packed oneDNN weight, and the
49152-row LM head at 32 rows 30 ms against 12 ms (``bench/rollout_throughput.py`` measures the
effect on a whole rollout). PyTorch's inductor uses the same two ops (``_reorder_linear_weight``,
``_linear_pointwise``) when it freezes a CPU model.

``PackedLinears`` packs every ``nn.Linear`` weight once, repacks when a weight changed in place
(the trainer's optimizer step: the tensors' version counters move), and ``active`` routes the
model's linear layers through the packed copies for the forwards inside the block only; the
trainer's forwards are untouched. Results equal ``F.linear``'s up to float rounding (a different
summation order). Where the ops or a plain CPU float weight are missing (CUDA, DTensor), it
does nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

_DTYPES = (torch.float32, torch.bfloat16)
ROWS_HINT = 32  # the batch size oneDNN tunes the packed layout for (any row count works)


def supported(model: torch.nn.Module) -> bool:
    """Whether the packed path applies: oneDNN present, every linear weight a CPU float tensor."""
    ops = torch.ops.mkldnn
    needed = ("_linear_pointwise", "_reorder_linear_weight")
    if not torch.backends.mkldnn.is_available() or not all(hasattr(ops, n) for n in needed):
        return False
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return bool(linears) and all(
        type(m.weight) is torch.nn.Parameter
        and m.weight.device.type == "cpu"
        and m.weight.dtype in _DTYPES
        for m in linears
    )


class PackedLinears:
    """Packed weights of ``model``'s linear layers, kept in step with the live weights."""

    def __init__(self, model: torch.nn.Module, enabled: bool = True) -> None:
        self.model = model
        self.enabled = enabled and supported(model)
        self.linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        self.packs: list[torch.Tensor] = []
        self._stamp: tuple[int, ...] = ()

    def refresh(self) -> None:
        """Repack when any linear weight changed in place since the last packing."""
        if not self.enabled:
            return
        # A weight updated in place bumps its version; a replaced one has a new address.
        stamp = tuple(v for m in self.linears for v in (m.weight.data_ptr(), m.weight._version))
        if stamp == self._stamp and self.packs:
            return
        with torch.no_grad():
            self.packs = [
                torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), ROWS_HINT)
                for m in self.linears
            ]
        self._stamp = stamp

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Inside the block, each linear layer computes from its packed weight."""
        if not self.enabled:
            yield
            return
        self.refresh()
        for module, packed in zip(self.linears, self.packs, strict=True):
            module.forward = _packed_forward(packed, module.bias)  # instance attr shadows class
        try:
            yield
        finally:
            for module in self.linears:
                del module.forward


def _packed_forward(
    packed: torch.Tensor, bias: torch.Tensor | None
) -> Callable[[torch.Tensor], torch.Tensor]:
    def forward(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

    return forward
