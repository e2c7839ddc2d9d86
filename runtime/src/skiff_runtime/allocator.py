"""glibc malloc settings for processes that move multi-megabyte tensors (the runtime, and its clients).

glibc serves an allocation above its mmap threshold with a fresh mmap() that page-faults on first touch and is
unmapped again on free, and it trims the heap top back to the kernel once more than the trim threshold is free.
A process that builds and frees a 588 KiB message per request pays those page faults on every request: a
model-less loopback round trip went from 2.9 to 1.2 ms with these settings, and a tritonclient process sending
MobileNet-sized images spent ~0.6-1 ms less per call (docs/design-decisions.md). Keeping such buffers in the heap costs
at most the trim threshold of idle memory per process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Mapping

MMAP_THRESHOLD_BYTES = 16 << 20
TRIM_THRESHOLD_BYTES = 64 << 20

# glibc reads these at process start (the runtime's launcher sets them before it re-executes itself).
ENV: Mapping[str, str] = {
    "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD_BYTES),
    "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD_BYTES),
}

# mallopt() parameter numbers from glibc's malloc.h.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def tune_current_process() -> bool:
    """The same settings for a process that is already running (a client), through mallopt(); True when applied,
    False where the C library is not glibc (then nothing changes)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    mmap_set = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    trim_set = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    return bool(mmap_set) and bool(trim_set)
