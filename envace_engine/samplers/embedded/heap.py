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

A long training job allocates blocks of many sizes (rollout K/V, micro-batch activations,
probes), and the kept heap fragments: the study's two-role arms grew past 24 GB RSS over 23
steps and were OOM-killed. ``release_freed_memory`` (glibc ``malloc_trim(0)``, every arena,
whole free pages only) hands the free part back once per training step (and the study calls
it after every evaluation setting); live memory and every computed value are untouched, and
the next step faults its pages in once.
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
def _libc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    path = ctypes.util.find_library("c")
    return ctypes.CDLL(path) if path else None


def release_freed_memory() -> bool:
    """Return the heap's free pages to the kernel (glibc only); whether any were released."""
    libc = _libc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    return bool(libc.malloc_trim(0))


@functools.cache
def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds once per process; whether both were set."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    mmap_ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    trim_ok = libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    return mmap_ok and trim_ok
