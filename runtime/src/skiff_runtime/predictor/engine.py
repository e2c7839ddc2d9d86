"""What an inference engine is to the rest of the runtime (predictor/paddle.py is the real one), and its warm-up."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from skiff_runtime.errors import ModelLoadError, SkiffError
from skiff_runtime.settings import RuntimeSettings, ShapeRange, TensorRTPrecision
from skiff_runtime.tensors import NUMPY_DTYPES, Array, ModelSignature

WARMUP_VARIABLE_DIM = 16
NO_RANGES: Mapping[str, ShapeRange] = {}


class Engine(Protocol):
    """One inference engine. Used by one thread at a time."""

    platform: str
    signature: ModelSignature

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]: ...


@runtime_checkable
class GroupEngine(Protocol):
    """An engine of a grouped model (a task: tensors.ModelSignature.grouped): it runs many requests side by side,
    each answered with its own outputs or its own error. It warms itself when built (warm_up leaves it alone)."""

    platform: str
    signature: ModelSignature

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]: ...

    def run_group(self, requests: Sequence[Mapping[str, Array]]) -> list[dict[str, Array] | SkiffError]: ...


def warmup_inputs(
    signature: ModelSignature, batch_size: int, ranges: Mapping[str, ShapeRange] = NO_RANGES
) -> dict[str, Array]:
    """Zero tensors for every input: batch dimension = batch_size; other variable dimensions from the input's
    TensorRT shape range (its opt shape), else 16."""
    inputs: dict[str, Array] = {}
    for spec in signature.inputs:
        opt = ranges[spec.name].opt if spec.name in ranges else None
        shape = [
            batch_size
            if axis == 0 and dim == -1
            else (dim if dim != -1 else (opt[axis] if opt else WARMUP_VARIABLE_DIM))
            for axis, dim in enumerate(spec.shape)
        ]
        inputs[spec.name] = np.zeros(shape, dtype=NUMPY_DTYPES[spec.datatype])
    return inputs


def check_shape_ranges(signature: ModelSignature, ranges: Mapping[str, ShapeRange]) -> None:
    """ModelLoadError when a range names no input of the model, or disagrees with its rank or fixed dimensions."""
    specs = {spec.name: spec for spec in signature.inputs}
    for name, shape_range in ranges.items():
        spec = specs.get(name)
        if spec is None:
            raise ModelLoadError(
                f"--trt-shape-ranges names input {name!r}; the model's inputs are {sorted(specs)}: fix the range's name"
            )
        for label, shape in (("min", shape_range.min), ("opt", shape_range.opt), ("max", shape_range.max)):
            fits = len(shape) == len(spec.shape) and all(d in (-1, s) for d, s in zip(spec.shape, shape, strict=True))
            if not fits:
                raise ModelLoadError(
                    f"--trt-shape-ranges {name}: the {label} shape {list(shape)} does not fit the input's shape "
                    f"{list(spec.shape)} (-1 = any): give every dimension, with the fixed ones as the model has them"
                )


def shape_range_inputs(signature: ModelSignature, ranges: Mapping[str, ShapeRange]) -> list[dict[str, Array]]:
    """Zero tensors at the min, the opt and the max of every TensorRT shape range, all ranges at once (TensorRT
    builds one optimization profile from them); inputs without a range take the batch of the ranged ones."""
    if not ranges:
        return []
    check_shape_ranges(signature, ranges)
    batches = []
    for point in ("min", "opt", "max"):
        shapes: dict[str, tuple[int, ...]] = {name: getattr(r, point) for name, r in ranges.items()}
        batch = next(iter(shapes.values()))[0]
        inputs = warmup_inputs(signature, batch)
        for spec in signature.inputs:
            if spec.name in shapes:
                inputs[spec.name] = np.zeros(shapes[spec.name], dtype=NUMPY_DTYPES[spec.datatype])
        batches.append(inputs)
    return batches


def warmup_shape_ranges(settings: RuntimeSettings) -> Mapping[str, ShapeRange]:
    """The shape ranges warm-up covers: TensorRT's, on GPU with TensorRT on (elsewhere they configure nothing)."""
    if settings.device.kind != "gpu":
        return NO_RANGES
    if settings.tensorrt_precision is TensorRTPrecision.OFF:
        return NO_RANGES
    return settings.trt_shape_ranges


def warm_up(engine: Engine, batch_sizes: Iterable[int], ranges: Mapping[str, ShapeRange] = NO_RANGES) -> None:
    """Run every batch size once, then the min, opt and max of every shape range: first runs build kernels
    (oneDNN primitives, TensorRT engines and profiles) per shape, so no real request pays for one. A grouped
    engine's inputs are a task's (images, not tensors of a shape): it warmed its sub-models when it was built."""
    if engine.signature.grouped:
        return
    check_shape_ranges(engine.signature, ranges)
    for size in batch_sizes:
        engine.run(warmup_inputs(engine.signature, size, ranges))
    for inputs in shape_range_inputs(engine.signature, ranges):
        engine.run(inputs)
