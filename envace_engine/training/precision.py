"""Whether a training forward runs under bf16 autocast: ``bf16 = true`` asks for it, the
hardware decides.

Why. bf16 autocast pays where bf16 GEMMs run natively — a GPU with bf16 support, or a CPU with
AMX-BF16 or AVX512-BF16 (oneDNN's bf16 kernels) — and costs elsewhere: on an AVX2-only AMD
EPYC (Zen 3) torch 2.13 runs CPU bf16 matmuls through its reference kernel, and a 2048×576 ×
576×1536 linear took 256 ms in bf16 against 37 ms in fp32 (docs/training.md). An SFT step
there took minutes instead of seconds. So a config that asks for bf16 gets it where it is
native and fp32 otherwise, with one log line saying which runs; fp32 master weights and AdamW
state are the same either way.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch

from envace_engine.samplers.embedded.packed import cpu_bf16

LOG = logging.getLogger(__name__)


def bf16_autocast(requested: bool, device: Any) -> bool:
    """Whether to enable bf16 autocast on ``device`` (a ``torch.device``) when the config asks
    for ``requested``: native bf16 GEMMs only (``packed.cpu_bf16`` on a CPU)."""
    if not requested:
        return False
    kind = device.type
    if kind == "cpu":
        unit = cpu_bf16()
        _log_choice(kind, unit)
        return unit is not None
    if kind == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    return True


@functools.cache
def _log_choice(kind: str, unit: str | None) -> None:
    if unit:
        LOG.info("training: bf16 autocast (%s has %s), fp32 master weights", kind, unit)
    else:
        LOG.warning(
            "training: bf16 asked for, but this CPU has no native bf16 unit (AMX-BF16, "
            "AVX512-BF16), where bf16 GEMMs are several times slower than fp32: training in "
            "fp32 (set bf16 = false to say so)"
        )
