"""predictor.engine: warm-up runs every batch size and the min, opt and max of every TensorRT shape range."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest

from skiff_runtime.errors import ModelLoadError
from skiff_runtime.predictor.engine import NO_RANGES, shape_range_inputs, warm_up, warmup_shape_ranges
from skiff_runtime.settings import parse_settings, parse_shape_ranges
from skiff_runtime.tensors import Array, Datatype, ModelSignature, TensorSpec

SIGNATURE = ModelSignature(
    inputs=(TensorSpec("ids", Datatype.INT64, (-1, -1)), TensorSpec("scale", Datatype.FP32, (-1, 1))),
    outputs=(TensorSpec("out", Datatype.FP32, (-1, -1)),),
)
RANGES = parse_shape_ranges("ids=1x16:8x128:32x512")


class ShapeRecorder:
    platform = "fake"
    signature = SIGNATURE

    def __init__(self) -> None:
        self.shapes: list[dict[str, tuple[int, ...]]] = []

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        self.shapes.append({name: array.shape for name, array in inputs.items()})
        return {}


def test_warm_up_covers_the_min_opt_and_max_of_every_shape_range() -> None:
    engine = ShapeRecorder()
    warm_up(engine, [1, 2], RANGES)
    ids = [s["ids"] for s in engine.shapes]
    assert ids[:2] == [(1, 128), (2, 128)]  # batch sizes, at the range's opt sequence length
    assert ids[2:] == [(1, 16), (8, 128), (32, 512)]  # min, opt, max
    assert [s["scale"] for s in engine.shapes[2:]] == [(1, 1), (8, 1), (32, 1)]  # the unranged input follows the batch


def test_without_ranges_warm_up_is_the_batch_sizes_alone() -> None:
    engine = ShapeRecorder()
    warm_up(engine, [1, 4])
    assert [s["ids"] for s in engine.shapes] == [(1, 16), (4, 16)]


def test_every_range_is_warmed_together_in_one_profile() -> None:
    ranges = parse_shape_ranges("ids=1x16:8x128:32x512;scale=1x1:8x1:32x1")
    batches = shape_range_inputs(SIGNATURE, ranges)
    assert [(b["ids"].shape, b["scale"].shape) for b in batches] == [
        ((1, 16), (1, 1)), ((8, 128), (8, 1)), ((32, 512), (32, 1))
    ]  # fmt: skip
    assert all(b["ids"].dtype == np.int64 and b["scale"].dtype == np.float32 for b in batches)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("mask=1x16:8x128:32x512", "names input 'mask'"), ("scale=1x2:8x2:32x2", "does not fit the input's shape")],
)
def test_a_range_that_does_not_fit_the_model_fails_the_load_with_its_fix(text: str, fragment: str) -> None:
    with pytest.raises(ModelLoadError, match="--trt-shape-ranges") as refused:
        warm_up(ShapeRecorder(), [1], parse_shape_ranges(text))
    assert fragment in str(refused.value)


def test_ranges_are_warmed_only_where_tensorrt_uses_them() -> None:
    flags = ["--model-dir", "/m", "--model-name", "m", "--trt-shape-ranges", "ids=1x16:8x128:32x512"]
    assert warmup_shape_ranges(parse_settings([*flags, "--device", "gpu:0", "--tensorrt-precision", "fp16"], {}))
    assert warmup_shape_ranges(parse_settings([*flags, "--device", "gpu:0"], {})) is NO_RANGES
    assert warmup_shape_ranges(parse_settings([*flags, "--tensorrt-precision", "fp16"], {})) is NO_RANGES
