"""Merges requests into one batch along axis 0 and splits the outputs back; numpy only, no I/O.

The only place requests are merged: the thread worker merges into new arrays, the process pool straight into a
worker's shared memory (`merged_shapes`, `merge_into`), both with the functions here.
"""

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


def merged_shapes(requests: Sequence[Mapping[str, Array]]) -> dict[str, tuple[np.dtype[np.generic], tuple[int, ...]]]:
    """Each input's dtype and shape once the requests are merged (the rows of every request, in order)."""
    return {
        name: (array.dtype, (sum(int(r[name].shape[0]) for r in requests), *array.shape[1:]))
        for name, array in requests[0].items()
    }


def merge_inputs(requests: Sequence[Mapping[str, Array]]) -> dict[str, Array]:
    """One batch: each input concatenated along axis 0, in request order (a single request is passed through)."""
    if len(requests) == 1:
        return dict(requests[0])
    return {name: np.concatenate([r[name] for r in requests], axis=0) for name in requests[0]}


def merge_into(requests: Sequence[Mapping[str, Array]], out: Mapping[str, Array]) -> None:
    """The same batch written into `out` (arrays of `merged_shapes`, e.g. in shared memory): one copy per byte."""
    for name, target in out.items():
        if len(requests) == 1:
            np.copyto(target, requests[0][name])
        else:
            np.concatenate([r[name] for r in requests], axis=0, out=target)


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
