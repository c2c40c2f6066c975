"""Keep freed memory in the process's heap (glibc ``mallopt``) while sampling on a CPU.

Why. A CPU forward allocates and frees many tensors of a few MB each (prefill activations, K/V
blocks, the naive baseline's growing caches). glibc serves blocks above its mmap threshold with
fresh ``mmap`` pages and hands a freed heap top back to the kernel above its trim threshold, so
the next forward page-faults the same memory in again and the kernel zeroes it again: a
rollout of ``bench/rollout_throughput.py`` can spend seconds of system time on page faults.
With the thresholds raised, freed blocks stay in the heap and the faults mostly disappear
(``tests/test_sampler_heap.py`` checks the effect on plain malloc/free).

Cost: the process keeps its peak heap instead of returning it, as PyTorch's CUDA caching
allocator does on a GPU. ``HFSampler`` calls ``keep_freed_memory`` when its model is on a CPU;
it is process-wide, only ever raises the thresholds, and does nothing off glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform

M_TRIM_THRESHOLD = -1  # mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's ceiling for this setting on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes a C int: return a heap top only past 2 GB free


@functools.cache
def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds once per process; whether both were set."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    path = ctypes.util.find_library("c")
    libc = ctypes.CDLL(path) if path else None
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    mmap_ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    trim_ok = libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    return mmap_ok and trim_ok
