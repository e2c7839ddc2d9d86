"""predictor.calibration: INT8 calibrates on the samples of --trt-calibration-dir, checked against the model's
inputs, in a calibrating engine dropped before the serving one is built (fake engines, no Paddle, no GPU)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from skiff_runtime.errors import ModelLoadError
from skiff_runtime.predictor.calibration import calibrate, has_table, read_samples, table_dirs
from skiff_runtime.tensors import Array, Datatype, ModelSignature, TensorSpec

SIGNATURE = ModelSignature(
    inputs=(TensorSpec("image", Datatype.FP32, (-1, 3, 8, 8)), TensorSpec("ids", Datatype.INT64, (-1, 2))),
    outputs=(TensorSpec("out", Datatype.FP32, (-1, 10)),),
)


def _save(directory: Path, name: str, rows: int = 2, **override: np.ndarray) -> None:
    rng = np.random.default_rng(rows)
    arrays = {"image": rng.random((rows, 3, 8, 8), dtype=np.float32), "ids": np.arange(rows * 2).reshape(rows, 2)}
    np.savez(directory / name, **{**arrays, **override})


class RecordingEngine:
    """Records what it ran and when it was dropped, into the shared event list."""

    def __init__(self, events: list[str], seen: list[Mapping[str, Array]]) -> None:
        self.events, self.seen = events, seen
        events.append("built")

    def run(self, inputs: Mapping[str, Array]) -> None:
        self.events.append("run")
        self.seen.append(inputs)

    def __del__(self) -> None:
        self.events.append("dropped")


def test_the_calibrating_engine_sees_every_sample_and_is_dropped_before_the_caller_goes_on(tmp_path: Path) -> None:
    for i, rows in enumerate((1, 4, 2)):
        _save(tmp_path, f"batch{i}.npz", rows)
    events: list[str] = []
    seen: list[Mapping[str, Array]] = []
    assert calibrate(lambda: RecordingEngine(events, seen), read_samples(tmp_path, SIGNATURE)) == 3
    assert events == ["built", "run", "run", "run", "dropped"]
    assert [s["image"].shape[0] for s in seen] == [1, 4, 2]  # in file-name order
    assert all(float(np.abs(s["image"]).sum()) > 0 for s in seen)  # real data, never the warm-up's zeros


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda d: None, "holds no .npz files"),
        (lambda d: _save(d, "a.npz", image=np.zeros((2, 3, 8, 8), np.float64)), "image is float64[2, 3, 8, 8]"),
        (lambda d: _save(d, "a.npz", image=np.zeros((2, 3, 4, 4), np.float32)), "the model takes float32[-1, 3, 8, 8]"),
        (lambda d: np.savez(d / "a.npz", image=np.zeros((1, 3, 8, 8), np.float32)), "the model's inputs are"),
        (lambda d: _save(d, "a.npz", ids=np.zeros((5, 2), np.int64)), "different batch sizes"),
        (lambda d: (d / "a.npz").write_bytes(b"not a zip"), "not a readable .npz"),
    ],
    ids=["empty", "dtype", "shape", "missing-input", "batch-mismatch", "corrupt"],
)
def test_bad_calibration_data_is_refused_naming_the_file_and_the_fix(tmp_path: Path, make, fragment: str) -> None:
    make(tmp_path)
    with pytest.raises(ModelLoadError, match="calibration") as refused:
        calibrate(lambda: pytest.fail("no engine is built for bad data"), read_samples(tmp_path, SIGNATURE))
    assert fragment in str(refused.value)


def test_an_empty_directory_fails_before_any_engine_is_built(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"holds no \.npz files"):
        read_samples(tmp_path, SIGNATURE)  # listing happens here, not on the first sample
    with pytest.raises(ModelLoadError, match="is not a directory"):
        read_samples(tmp_path / "absent", SIGNATURE)


def test_a_table_left_by_an_earlier_start_is_found_in_the_cache_or_next_to_the_model(tmp_path: Path) -> None:
    model, cache = tmp_path / "model", tmp_path / "cache"
    model.mkdir()
    cache.mkdir()
    assert not has_table(table_dirs(model, cache))
    (model / "_opt_cache").mkdir()
    (model / "_opt_cache" / "trt_calib_123").write_text("table")
    assert has_table(table_dirs(model, None))
    assert not has_table([cache])
    (cache / "trt_calib_9").write_text("table")
    assert has_table([cache])
