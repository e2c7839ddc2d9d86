"""Merges requests into one batch along axis 0 and splits the outputs back; numpy only, no I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from skiff_runtime.tensors import Array

# Requests batch together only when every input agrees on name, dtype and non-batch shape.
BatchKey = tuple[tuple[str, str, tuple[int, ...]], ...]


def batch_key(inputs: Mapping[str, Array]) -> BatchKey:
    return tuple(sorted((name, array.dtype.str, tuple(array.shape[1:])) for name, array in inputs.items()))


def batch_size(inputs: Mapping[str, Array]) -> int:
    """The batch dimension shared by the inputs (requests were validated before they get here)."""
    return int(next(iter(inputs.values())).shape[0]) if inputs else 0


def merge_inputs(requests: Sequence[Mapping[str, Array]]) -> dict[str, Array]:
    """One batch: each input concatenated along axis 0, in request order (a single request is passed through)."""
    if len(requests) == 1:
        return dict(requests[0])
    return {name: np.concatenate([r[name] for r in requests], axis=0) for name in requests[0]}


def split_outputs(outputs: Mapping[str, Array], sizes: Sequence[int]) -> list[dict[str, Array]]:
    """Per-request outputs: slices (views, no copies) of each output along axis 0."""
    total = sum(sizes)
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise ValueError(f"output {name!r} has shape {list(array.shape)}; expected batch dimension {total}")
    result: list[dict[str, Array]] = []
    start = 0
    for size in sizes:
        result.append({name: array[start : start + size] for name, array in outputs.items()})
        start += size
    return result
