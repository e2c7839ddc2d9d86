"""The Paddle Inference Config calls the settings ask for, as data: tested with no Paddle and no GPU (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from skiff_runtime.settings import RuntimeSettings, TensorRTPrecision

# --tensorrt-precision -> the name of its paddle.inference.PrecisionType member
PRECISION_TYPES = {
    TensorRTPrecision.FP32: "Float32",
    TensorRTPrecision.FP16: "Half",
    TensorRTPrecision.INT8: "Int8",
}


@dataclass(frozen=True)
class Call:
    """One method call on a paddle.inference.Config; a PrecisionType is named by `precision` (resolved by the
    adapter, predictor.paddle)."""

    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


def config_calls(settings: RuntimeSettings) -> tuple[Call, ...]:
    """The calls after Config(program, params): device, TensorRT (precision, dynamic shapes, engine cache), CPU."""
    calls = [Call("disable_glog_info"), Call("switch_ir_optim", (True,))]
    if settings.device.kind != "gpu":
        calls += [
            Call("disable_gpu"),
            Call("set_cpu_math_library_num_threads", (settings.cpu_threads,)),
            Call("enable_mkldnn" if settings.enable_mkldnn else "disable_mkldnn"),
        ]
        return tuple(calls)
    calls.append(Call("enable_use_gpu", (settings.gpu_memory_pool_mb, settings.device.index)))
    if settings.tensorrt_precision is TensorRTPrecision.OFF:
        return tuple(calls)
    cached = settings.trt_cache_dir is not None
    calls.append(
        Call(
            "enable_tensorrt_engine",
            kwargs={
                "workspace_size": settings.trt_workspace_mb << 20,
                "max_batch_size": settings.batching.max_batch_size,
                "min_subgraph_size": settings.trt_min_subgraph_size,
                "precision_mode": PRECISION_TYPES[settings.tensorrt_precision],
                "use_static": cached,  # serialize built engines, and load them on the next start
                "use_calib_mode": settings.tensorrt_precision is TensorRTPrecision.INT8,
            },
        )
    )
    ranges = settings.trt_shape_ranges
    if ranges:
        calls.append(
            Call(
                "set_trt_dynamic_shape_info",
                (
                    {name: list(r.min) for name, r in ranges.items()},
                    {name: list(r.max) for name, r in ranges.items()},
                    {name: list(r.opt) for name, r in ranges.items()},
                ),
            )
        )
    if cached:
        calls.append(Call("set_optim_cache_dir", (str(settings.trt_cache_dir),)))
    return tuple(calls)
