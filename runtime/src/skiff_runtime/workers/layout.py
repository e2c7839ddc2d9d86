"""Places named arrays in a flat shared buffer and describes them in small picklable tuples (no I/O)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from skiff_runtime.batching.merge import merge_into, merged_shapes
from skiff_runtime.errors import InferenceFailed
from skiff_runtime.tensors import Array

ALIGN = 64

# (name, numpy dtype string, shape, byte offset)
Descriptor = tuple[str, str, tuple[int, ...], int]


def _aligned(offset: int) -> int:
    return (offset + ALIGN - 1) // ALIGN * ALIGN


def plan(shapes: Mapping[str, tuple[np.dtype[np.generic], tuple[int, ...]]], capacity: int) -> list[Descriptor]:
    """Consecutive, aligned slots for each array; InferenceFailed when they do not fit the buffer."""
    descriptors: list[Descriptor] = []
    offset = 0
    for name, (dtype, shape) in shapes.items():
        if dtype.hasobject:
            raise InferenceFailed(f"tensor {name!r} holds Python objects; it cannot cross to a worker process")
        offset = _aligned(offset)
        descriptors.append((name, dtype.str, shape, offset))
        offset += math.prod(shape) * dtype.itemsize  # Python ints: exact, and ~10x cheaper than np.prod
    if offset > capacity:
        raise InferenceFailed(
            f"batch needs {offset} bytes of worker shared memory, which holds {capacity}; "
            "lower --max-batch-size or raise --max-message-mb"
        )
    return descriptors


def views(buffer: memoryview, descriptors: Sequence[Descriptor]) -> dict[str, Array]:
    """Arrays over the buffer (no copies) for each descriptor."""
    out: dict[str, Array] = {}
    for name, dtype_str, shape, offset in descriptors:
        dtype = np.dtype(dtype_str)
        count = math.prod(shape)
        out[name] = np.frombuffer(buffer, dtype=dtype, count=count, offset=offset).reshape(shape)
    return out


def write_batch(buffer: memoryview, parts: Sequence[Mapping[str, Array]], capacity: int) -> list[Descriptor]:
    """Merge `parts` into one batch straight in the buffer (batching.merge: one copy per byte); its descriptors."""
    descriptors = plan(merged_shapes(parts), capacity)
    merge_into(parts, views(buffer, descriptors))
    return descriptors


def write_arrays(buffer: memoryview, arrays: Mapping[str, Array], capacity: int) -> list[Descriptor]:
    descriptors = plan({name: (a.dtype, tuple(a.shape)) for name, a in arrays.items()}, capacity)
    for name, target in views(buffer, descriptors).items():
        np.copyto(target, arrays[name])
    return descriptors
