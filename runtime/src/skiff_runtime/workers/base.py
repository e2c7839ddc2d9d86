"""What the service needs from its workers, and the warm-up every worker runs before it is ready."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from skiff_runtime.tensors import NUMPY_DTYPES, Array, ModelSignature

WARMUP_VARIABLE_DIM = 16


@dataclass(frozen=True)
class WorkerEvent:
    """A worker process exited, or its replacement became ready. `alive` counts the workers able to run batches
    afterwards; `gave_up` means the pool will not replace it (the replacement failed to load, or workers died too
    often) and the server should stop so that Kubernetes restarts the pod."""

    index: int
    exitcode: int | None
    alive: int
    gave_up: bool = False


WorkerEvents = Callable[[WorkerEvent], None]


class Engine(Protocol):
    """One inference engine (predictor/paddle.py provides the real one). Used by one thread at a time."""

    platform: str
    signature: ModelSignature

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]: ...


class Workers(Protocol):
    """A set of engines behind one async `run`; each call runs one batch on one free worker."""

    count: int

    @property
    def platform(self) -> str: ...

    @property
    def signature(self) -> ModelSignature: ...

    async def start(self, warmup_batch_sizes: Sequence[int]) -> None: ...

    async def run(self, parts: Sequence[Mapping[str, Array]]) -> dict[str, Array]:
        """Run the concatenation (axis 0) of `parts` as one batch; outputs are owned by the caller."""
        ...

    async def close(self) -> None: ...


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


def is_batchable(signature: ModelSignature) -> bool:
    """Requests can be merged only when every input and output has a variable leading (batch) dimension."""
    tensors = signature.inputs + signature.outputs
    return all(t.shape and t.shape[0] == -1 for t in tensors)
