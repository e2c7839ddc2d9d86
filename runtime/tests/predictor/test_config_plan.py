"""predictor.config_plan: the Paddle Config calls for CPU, GPU and TensorRT settings, checked with no GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from skiff_runtime.predictor.config_plan import PRECISION_TYPES, Call, config_calls
from skiff_runtime.settings import TensorRTPrecision, parse_settings


def _calls(*flags: str) -> dict[str, Call]:
    settings = parse_settings(["--model-dir", "/m", "--model-name", "m", *flags], env={})
    calls = config_calls(settings)
    assert len({c.method for c in calls}) == len(calls), "each method is called once"
    return {c.method: c for c in calls}


def test_cpu_gets_threads_and_onednn_and_no_gpu() -> None:
    calls = _calls("--cpu-threads", "3")
    assert calls["set_cpu_math_library_num_threads"].args == (3,)
    assert "enable_mkldnn" in calls
    assert "enable_use_gpu" not in calls
    assert "disable_mkldnn" in _calls("--enable-mkldnn", "false")


def test_cpu_ignores_tensorrt() -> None:
    assert "enable_tensorrt_engine" not in _calls("--tensorrt-precision", "fp16")


def test_gpu_without_tensorrt_uses_the_memory_pool_and_device() -> None:
    calls = _calls("--device", "gpu:1", "--gpu-memory-pool-mb", "2048")
    assert calls["enable_use_gpu"].args == (2048, 1)
    assert not {"enable_tensorrt_engine", "set_trt_dynamic_shape_info", "set_optim_cache_dir"} & set(calls)


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_tensorrt_precision_and_calibration(precision: str) -> None:
    samples = ("--trt-calibration-dir", "/m/calibration") if precision == "int8" else ()
    engine = _calls("--device", "gpu", "--tensorrt-precision", precision, *samples)["enable_tensorrt_engine"].kwargs
    assert engine["precision_mode"] == PRECISION_TYPES[TensorRTPrecision(precision)]
    assert engine["use_calib_mode"] is (precision == "int8")
    assert engine["use_static"] is False  # nowhere to keep engines


def test_tensorrt_shape_ranges_go_to_dynamic_shape_info_as_min_max_opt() -> None:
    calls = _calls("--device", "gpu", "--tensorrt-precision", "fp16", "--max-batch-size", "32",
                   "--trt-shape-ranges", "ids=1x16:8x128:32x512;mask=1x16:8x128:32x512")  # fmt: skip
    low, high, opt = calls["set_trt_dynamic_shape_info"].args
    assert low == {"ids": [1, 16], "mask": [1, 16]}
    assert high == {"ids": [32, 512], "mask": [32, 512]}
    assert opt == {"ids": [8, 128], "mask": [8, 128]}
    assert calls["enable_tensorrt_engine"].kwargs["max_batch_size"] == 32


def test_engine_cache_dir_serializes_engines_there() -> None:
    calls = _calls("--device", "gpu", "--tensorrt-precision", "fp32", "--trt-cache-dir", "/var/cache/skiff/trt")
    assert calls["enable_tensorrt_engine"].kwargs["use_static"] is True
    assert calls["set_optim_cache_dir"].args == (str(Path("/var/cache/skiff/trt")),)


def test_every_precision_names_a_paddle_precision_type() -> None:
    assert set(PRECISION_TYPES) == set(TensorRTPrecision) - {TensorRTPrecision.OFF}


@pytest.mark.paddle
def test_the_adapter_applies_the_plan_to_a_real_config(model_dirs) -> None:
    """predictor.paddle builds a real Config from the plan; CPU Paddle reports what it was given."""
    from skiff_runtime.predictor.files import find_model_files
    from skiff_runtime.predictor.paddle import build_config

    settings = parse_settings(["--model-dir", str(model_dirs["conv"]), "--model-name", "conv", "--cpu-threads", "2",
                               "--enable-mkldnn", "false"], env={})  # fmt: skip
    config = build_config(find_model_files(settings.model_dir, None), settings)
    assert config.cpu_math_library_num_threads() == 2
    assert not config.mkldnn_enabled()
    assert not config.use_gpu()
