"""The allocator settings change where glibc puts a multi-megabyte buffer: a fresh mmap() before, the heap after."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from skiff_runtime import allocator

# Prints whether a 4 MiB buffer allocated after (optionally) tuning lies inside the process heap ([heap] in maps).
PROBE = """
import ctypes, sys
from skiff_runtime import allocator
tuned = allocator.tune_current_process() if sys.argv[1] == "tune" else None
buffer = bytearray(4 << 20)
address = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
for line in open("/proc/self/maps"):
    if line.rstrip().endswith("[heap]"):
        start, end = (int(x, 16) for x in line.split()[0].split("-"))
        print(tuned, start <= address < end)
        break
else:
    print(tuned, False)
"""


def _probe(mode: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    result = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True, timeout=60, env=env
    )
    return result.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc/self/maps are Linux-only")
def test_tuning_keeps_large_buffers_in_the_heap() -> None:
    assert _probe("plain") == "None False"  # control: glibc's default threshold (128 KiB) mmaps a 4 MiB buffer
    assert _probe("tune") == "True True"


def test_environment_table_matches_the_mallopt_values() -> None:
    assert {
        "MALLOC_MMAP_THRESHOLD_": str(allocator.MMAP_THRESHOLD_BYTES),
        "MALLOC_TRIM_THRESHOLD_": str(allocator.TRIM_THRESHOLD_BYTES),
    } == allocator.ENV
    assert allocator.MMAP_THRESHOLD_BYTES >= 4 << 20  # above a 1x3x224x224 FP32 image batch of a few images
