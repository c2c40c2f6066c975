"""embedded.heap: after ``keep_freed_memory`` freed heap blocks are reused, not faulted in again.

Each case runs in a fresh interpreter (the setting is process-wide and, once made, stays) that
allocates, touches and frees three 16 MB blocks six times through libc, and counts the minor
page faults of the last five rounds. glibc's defaults hand the freed blocks back to the kernel
(about 12k faults a round); with the thresholds raised they stay in the heap.
"""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)

SCRIPT = """
import ctypes, ctypes.util, resource, sys
from envace_engine.samplers.embedded.heap import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory() and keep_freed_memory()  # once per process, then cached
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
SIZE = 16 << 20

def round_trip():
    blocks = [libc.malloc(SIZE) for _ in range(3)]
    for block in blocks:
        libc.memset(block, 1, SIZE)
    for block in blocks:
        libc.free(block)

round_trip()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    round_trip()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[-1])


def test_freed_blocks_stay_in_the_heap_only_after_keep_freed_memory():
    pages = 5 * 3 * (16 << 20) // 4096  # every round faulting in every page
    assert page_faults("plain") > pages // 2  # glibc's defaults: handed back, faulted again
    assert page_faults("keep") < pages // 20


TRIM = """
import ctypes, ctypes.util, sys
from envace_engine.samplers.embedded.heap import keep_freed_memory, release_freed_memory
assert keep_freed_memory()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]

def rss_kb():
    return int(open("/proc/self/statm").read().split()[1]) * 4

blocks = [libc.malloc(16 << 20) for _ in range(8)]
for block in blocks:
    libc.memset(block, 1, 16 << 20)
for block in blocks:
    libc.free(block)
kept = rss_kb()
released = release_freed_memory()
print(kept, rss_kb(), released)
"""


def test_release_freed_memory_hands_the_kept_heap_back():
    out = subprocess.run([sys.executable, "-c", TRIM], capture_output=True, text=True, check=True)
    kept, after, released = out.stdout.split()
    assert released == "True"
    assert int(kept) - int(after) > 100_000  # most of the 128 MB freed back (kB)
