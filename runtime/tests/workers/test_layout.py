"""Placing batches in a worker's shared buffer: alignment, the merge written in place, capacity errors."""

from __future__ import annotations

import numpy as np
import pytest

from skiff_runtime.errors import InferenceFailed
from skiff_runtime.workers.layout import ALIGN, plan, views, write_arrays, write_batch


def test_a_merged_batch_lands_in_the_buffer_and_reads_back_through_views() -> None:
    buffer = memoryview(bytearray(4096))
    parts = [
        {"x": np.arange(6, dtype=np.float32).reshape(1, 6), "ids": np.array([[1, 2]], np.int64)},
        {"x": np.arange(12, dtype=np.float32).reshape(2, 6) + 100, "ids": np.array([[3, 4], [5, 6]], np.int64)},
    ]
    descriptors = write_batch(buffer, parts, len(buffer))
    assert [(name, shape) for name, _, shape, _ in descriptors] == [("x", (3, 6)), ("ids", (3, 2))]
    assert all(offset % ALIGN == 0 for *_, offset in descriptors)
    read = views(buffer, descriptors)
    np.testing.assert_array_equal(read["x"], np.concatenate([p["x"] for p in parts]))
    np.testing.assert_array_equal(read["ids"], [[1, 2], [3, 4], [5, 6]])
    assert np.shares_memory(read["x"], np.frombuffer(buffer, np.uint8))


def test_outputs_round_trip_with_their_dtypes() -> None:
    buffer = memoryview(bytearray(1024))
    arrays = {"a": np.array([True, False]), "b": np.arange(3, dtype=np.float16), "c": np.zeros((2, 0), np.int32)}
    read = views(buffer, write_arrays(buffer, arrays, len(buffer)))
    for name, array in arrays.items():
        assert read[name].dtype == array.dtype
        np.testing.assert_array_equal(read[name], array)


def test_a_batch_larger_than_the_buffer_fails_clearly() -> None:
    with pytest.raises(InferenceFailed, match="needs 4000 bytes of worker shared memory, which holds 1024"):
        plan({"x": (np.dtype(np.float32), (10, 100))}, 1024)


def test_object_arrays_cannot_cross_processes() -> None:
    with pytest.raises(InferenceFailed, match="holds Python objects"):
        plan({"s": (np.dtype(object), (2,))}, 1024)
