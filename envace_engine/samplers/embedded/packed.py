"""oneDNN-packed copies of a model's linear weights, for the embedded sampler's forwards (CPU).

Why. ``nn.Linear`` on a CPU calls MKL's sgemm, which re-packs the whole weight matrix on every
call. At a sampler's batch sizes (1 to 32 rows in decode, a few hundred in prefill) that packing
is most of the cost, and a pre-packed oneDNN weight avoids it (``bench/rollout_throughput.py``
measures the effect on a whole rollout). PyTorch's inductor uses the same two ops
(``_reorder_linear_weight``, ``_linear_pointwise``) when it freezes a CPU model.

``PackedLinears`` packs every ``nn.Linear`` weight once, repacks when a weight changed in place
(the trainer's optimizer step: the tensors' version counters move), and ``active`` routes the
model's linear layers through the packed copies for the forwards inside the block only; the
trainer's forwards are untouched. Results equal ``F.linear``'s up to float rounding (a different
summation order). Where the ops or a plain CPU float weight are missing (CUDA, DTensor), it
does nothing.

Siblings. Linear layers of one module that read the same input (attention's q/k/v, the MLP's
gate/up) are packed as one stacked weight: the first of them to see an input runs one GEMM for
all, the others take their columns of that result. At decode batch sizes a GEMM call's fixed
cost and its pass over the input are a large part of its time, so four calls per layer
instead of seven save time (``bench/rollout_throughput.py`` measures the whole rollout).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

_DTYPES = (torch.float32, torch.bfloat16)
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of native bf16 GEMMs
ROWS_HINT = 32  # the batch size oneDNN tunes the packed layout for (any row count works)
SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # read the same input


# CPU flags oneDNN's bf16 linear needs (its error otherwise: "bf16 path needs the cpu support
# avx_ne_convert or avx512bw, avx512vl and avx512dq"); an AVX2-only CPU has neither set.
ONEDNN_BF16_FLAG_SETS = (("avx_ne_convert",), ("avx512bw", "avx512vl", "avx512dq"))


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (Linux; empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def cpu_bf16() -> str | None:
    """The CPU's native bf16 matrix unit (``amx_bf16`` or ``avx512_bf16``), or None.

    Without one, bf16 GEMMs are emulated and slower than fp32, so the sampler stays in fp32.
    """
    flags = cpu_flags()
    return next((f for f in CPU_BF16_FLAGS if f in flags), None)


def onednn_bf16() -> bool:
    """Whether oneDNN's packed bf16 linear runs on this CPU at all (emulated or native)."""
    flags = cpu_flags()
    return any(all(f in flags for f in need) for need in ONEDNN_BF16_FLAG_SETS)


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


class PackedGemm:
    """One packed weight for one linear layer or for siblings reading the same input.

    ``memo`` holds the last input, the whole output and which siblings took their columns of
    it: a sibling takes its columns when the input is the same tensor object and it has not
    taken them yet, else the GEMM runs again. (Inference tensors have no version counter, so
    an input changed in place between two siblings' calls would go unseen; transformers'
    layers pass the same untouched tensor to each.)
    """

    def __init__(self, linears: list[torch.nn.Linear], dtype: torch.dtype | None = None) -> None:
        self.linears = linears
        self.dtype = dtype  # compute dtype of the GEMM (None: the weight's own)
        sizes = [m.out_features for m in linears]
        self.spans = [(sum(sizes[:i]), n) for i, n in enumerate(sizes)]
        self.weight = torch.empty(0)
        self.bias: torch.Tensor | None = None
        self.memo: tuple[torch.Tensor, torch.Tensor, set[int]] | None = None

    def stamp(self) -> tuple[int, ...]:
        """Addresses and version counters of the live weights and biases."""
        parts = [p for m in self.linears for p in (m.weight, m.bias) if p is not None]
        return tuple(v for p in parts for v in (p.data_ptr(), p._version))

    def pack(self) -> None:
        """Pack the live weights (stacked when there are siblings)."""
        weights = [m.weight.detach() for m in self.linears]
        stacked = weights[0] if len(weights) == 1 else torch.cat(weights)
        if self.dtype is not None:
            stacked = stacked.to(self.dtype)
        self.weight = torch.ops.mkldnn._reorder_linear_weight(stacked, ROWS_HINT)
        biases = [m.bias for m in self.linears]
        self.bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
        if self.bias is not None and self.dtype is not None:
            self.bias = self.bias.to(self.dtype)
        self.memo = None

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """The stacked layers' output for ``x``, in the compute dtype (``x`` cast to it)."""
        if self.dtype is not None and x.dtype != self.dtype:
            x = x.to(self.dtype)
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")

    def _gemm(self, x: torch.Tensor) -> torch.Tensor:
        # bf16 GEMM on the CPU's bf16 unit, fp32 activations around it (norms, attention)
        return self.matmul(x).to(x.dtype)

    def forward_of(self, i: int) -> Callable[[torch.Tensor], torch.Tensor]:
        """The forward of the ``i``-th linear layer."""
        if len(self.linears) == 1:
            return self._gemm
        start, size = self.spans[i]

        def forward(x: torch.Tensor) -> torch.Tensor:
            memo = self.memo
            if memo is None or memo[0] is not x or i in memo[2]:
                memo = self.memo = (x, self._gemm(x), set())
            memo[2].add(i)
            return memo[1].narrow(-1, start, size)

        return forward


def _groups(model: torch.nn.Module) -> list[list[torch.nn.Linear]]:
    """The model's linear layers, siblings (``SIBLINGS``, same input size, all with or all
    without bias) grouped, each other one alone."""
    groups: list[list[torch.nn.Linear]] = []
    grouped: set[int] = set()
    for module in model.modules():
        for names in SIBLINGS:
            members = [
                m for n in names if isinstance(m := getattr(module, n, None), torch.nn.Linear)
            ]
            if len(members) < len(names):
                continue
            if len({(m.in_features, m.bias is None) for m in members}) == 1:
                groups.append(members)
                grouped.update(id(m) for m in members)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return groups + [[m] for m in linears if id(m) not in grouped]


class PackedLinears:
    """Packed weights of ``model``'s linear layers, kept in step with the live weights.

    ``dtype``: the GEMMs' compute dtype (``torch.bfloat16``: bf16 copies of the weights, inputs
    cast to bf16 and outputs back); None computes in the weights' own dtype. The LM head too:
    a bf16-autocast trainer computes its log-probs from a bf16 head (``logprobs._tile``), and
    in fp32 the head alone took as long as every other GEMM of a decode step
    (``bench/decode_step.py``).
    """

    def __init__(
        self, model: torch.nn.Module, enabled: bool = True, dtype: torch.dtype | None = None
    ) -> None:
        self.model = model
        self.enabled = enabled and supported(model)
        self.dtype = dtype
        self.packs = [PackedGemm(g, dtype) for g in _groups(model)] if self.enabled else []
        self._stamp: tuple[int, ...] = ()

    def refresh(self) -> None:
        """Repack when any linear weight or bias changed since the last packing."""
        if not self.enabled:
            return
        # A weight updated in place bumps its version; a replaced one has a new address.
        stamp = tuple(v for p in self.packs for v in p.stamp())
        if stamp == self._stamp:
            return
        with torch.no_grad():
            for pack in self.packs:
                pack.pack()
        self._stamp = stamp

    def pack_of(
        self, linear: torch.nn.Module, members: tuple[torch.nn.Module, ...] | None = None
    ) -> PackedGemm:
        """The packed GEMM of ``linear``, stacked with exactly ``members`` (default: alone)."""
        want = list(members or (linear,))
        for pack in self.packs:
            if pack.linears[0] is linear:
                if len(pack.linears) == len(want) and all(
                    a is b for a, b in zip(pack.linears, want, strict=True)
                ):
                    return pack
                break
        raise ValueError(f"no packed GEMM stacks exactly {len(want)} layer(s) from {linear!r}")

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Inside the block, each linear layer computes from its packed weight."""
        if not self.enabled:
            yield
            return
        self.refresh()
        for pack in self.packs:
            for i, module in enumerate(pack.linears):
                # An instance attribute shadows the class's method on purpose (deleted below).
                module.forward = pack.forward_of(i)  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            for pack in self.packs:
                pack.memo = None
                for module in pack.linears:
                    del module.forward
