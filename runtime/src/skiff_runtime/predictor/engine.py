"""What an inference engine is to the rest of the runtime (predictor/paddle.py is the real one), and its warm-up."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

import numpy as np

from skiff_runtime.tensors import NUMPY_DTYPES, Array, ModelSignature

WARMUP_VARIABLE_DIM = 16


class Engine(Protocol):
    """One inference engine. Used by one thread at a time."""

    platform: str
    signature: ModelSignature

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]: ...


def warmup_inputs(signature: ModelSignature, batch_size: int) -> dict[str, Array]:
    """Zero tensors for every input: batch dimension = batch_size, other variable dimensions = 16."""
    inputs: dict[str, Array] = {}
    for spec in signature.inputs:
        shape = [
            (batch_size if axis == 0 else WARMUP_VARIABLE_DIM) if dim == -1 else dim
            for axis, dim in enumerate(spec.shape)
        ]
        inputs[spec.name] = np.zeros(shape, dtype=NUMPY_DTYPES[spec.datatype])
    return inputs


def warm_up(engine: Engine, batch_sizes: Iterable[int]) -> None:
    """Run every batch size once: first runs build kernels (oneDNN primitives, TensorRT engines) per shape."""
    for size in batch_sizes:
        engine.run(warmup_inputs(engine.signature, size))
