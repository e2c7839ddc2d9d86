"""Pure batch merging: keys, concatenation along axis 0 (into new arrays or given ones), and
splitting outputs back into views."""

from __future__ import annotations

import numpy as np
import pytest

from skiff_runtime.batching.merge import (
    batch_key,
    batch_size,
    merge_inputs,
    merge_into,
    merged_shapes,
    split_outputs,
)


def test_key_separates_dtype_and_non_batch_shape_but_not_batch_size() -> None:
    a = {"x": np.zeros((1, 3, 8), np.float32)}
    assert batch_key(a) == batch_key({"x": np.zeros((5, 3, 8), np.float32)})
    assert batch_key(a) != batch_key({"x": np.zeros((1, 3, 9), np.float32)})
    assert batch_key(a) != batch_key({"x": np.zeros((1, 3, 8), np.float16)})
    assert batch_key(a) != batch_key({"y": np.zeros((1, 3, 8), np.float32)})


def test_merge_concatenates_in_request_order_and_passes_a_single_request_through() -> None:
    first = {"x": np.full((1, 2), 1.0), "ids": np.array([[7]])}
    second = {"x": np.full((2, 2), 2.0), "ids": np.array([[8], [9]])}
    merged = merge_inputs([first, second])
    assert merged["x"].tolist() == [[1, 1], [2, 2], [2, 2]]
    assert merged["ids"].tolist() == [[7], [8], [9]]
    assert batch_size(merged) == 3
    alone = merge_inputs([first])
    assert alone["x"] is first["x"]


FIRST = {"x": np.full((1, 2), 1.0, np.float32), "ids": np.array([[7]], np.int64)}
SECOND = {"x": np.full((2, 2), 2.0, np.float32), "ids": np.array([[8], [9]], np.int64)}


@pytest.mark.parametrize(
    ("requests", "rows"), [([FIRST], 1), ([FIRST, SECOND], 3)], ids=["one request", "two requests"]
)
def test_merge_into_given_arrays_writes_the_same_batch_in_place(
    requests: list[dict[str, np.ndarray]], rows: int
) -> None:
    shapes = merged_shapes(requests)
    assert shapes == {"x": (np.dtype(np.float32), (rows, 2)), "ids": (np.dtype(np.int64), (rows, 1))}
    out = {name: np.empty(shape, dtype) for name, (dtype, shape) in shapes.items()}
    merge_into(requests, out)
    for name, array in merge_inputs(requests).items():
        np.testing.assert_array_equal(out[name], array)
        assert not np.shares_memory(out[name], requests[0][name])


def test_split_returns_views_per_request() -> None:
    outputs = {"y": np.arange(6).reshape(3, 2)}
    parts = split_outputs(outputs, [1, 2])
    assert [p["y"].tolist() for p in parts] == [[[0, 1]], [[2, 3], [4, 5]]]
    assert np.shares_memory(parts[1]["y"], outputs["y"])


@pytest.mark.parametrize("output", [np.zeros((4, 2)), np.float32(1.0)], ids=["wrong batch", "scalar"])
def test_split_rejects_outputs_without_the_batch_dimension(output: np.ndarray) -> None:
    with pytest.raises(ValueError, match="expected batch dimension 3"):
        split_outputs({"y": np.asarray(output)}, [1, 2])
