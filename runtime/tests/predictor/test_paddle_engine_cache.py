"""The Paddle engine with --trt-cache-dir on CPU: the first start publishes a complete entry, the next one is a hit.

On CPU Paddle serializes no TensorRT engine, so the entry holds only the marker; that Paddle writes engines into the
entry and a hit skips the build is proven only on a GPU (scripts/gpu_check.sh, docs/runtime.md "Engine cache").
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from skiff_runtime.predictor.engine_cache import MARKER, CacheResult, engine_key, entry_complete
from skiff_runtime.settings import parse_settings

pytestmark = pytest.mark.paddle


def _start(model_dir: Path, cache: Path):  # type: ignore[no-untyped-def]
    from skiff_runtime.predictor.paddle import PaddleEngine

    settings = parse_settings(
        ["--model-dir", str(model_dir), "--model-name", "m", "--trt-cache-dir", str(cache)], env={}
    )
    return PaddleEngine(settings)


def _answer(engine) -> np.ndarray:  # type: ignore[no-untyped-def]
    image = np.random.default_rng(0).standard_normal((2, 3, 32, 32), dtype=np.float32)
    return next(iter(engine.run({engine.signature.inputs[0].name: image}).values()))


def test_second_start_is_a_hit_and_answers_the_same(model_dirs, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _start(model_dirs["conv"], cache)
    assert first.cache_result is CacheResult.BUILT
    entries = [p for p in cache.iterdir() if p.is_dir()]
    assert len(entries) == 1
    assert entries[0].name.startswith("cpu-off-")
    assert (entries[0] / MARKER).is_file()
    second = _start(model_dirs["conv"], cache)
    assert second.cache_result is CacheResult.HIT
    np.testing.assert_array_equal(_answer(first), _answer(second))


def test_a_changed_model_gets_its_own_entry(model_dirs, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _start(model_dirs["conv"], cache)
    other = tmp_path / "other"
    shutil.copytree(model_dirs["conv"], other)
    params = next(other.glob("*.pdiparams"))
    params.write_bytes(params.read_bytes())  # same bytes, other directory: the same model
    assert _start(other, cache).cache_result is CacheResult.HIT
    data = bytearray(params.read_bytes())
    data[-1] ^= 1  # one weight changed: another model
    params.write_bytes(bytes(data))
    assert _start(other, cache).cache_result is CacheResult.BUILT
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 2


def test_key_follows_the_tensorrt_settings() -> None:
    base = ["--model-dir", "/m", "--model-name", "m", "--device", "gpu:0", "--tensorrt-precision", "fp16"]
    fp16 = parse_settings(base, env={})
    ranged = parse_settings([*base, "--trt-shape-ranges", "x=1x3:4x3:8x3"], env={})
    key = engine_key(fp16, "sha256:a", "NVIDIA H200", "3.3.1", "10.5.0")
    assert key.precision == "fp16"
    assert engine_key(ranged, "sha256:a", "NVIDIA H200", "3.3.1", "10.5.0").shape_ranges == "x=1x3:4x3:8x3"
    assert key.digest() != engine_key(ranged, "sha256:a", "NVIDIA H200", "3.3.1", "10.5.0").digest()
    assert not entry_complete(Path("/nonexistent"), key)
