"""Where a built predictor really runs, and why a GPU that was asked for is not used (pure: no Paddle, no GPU).

Paddle falls back to the CPU without failing: a build without CUDA only logs "Please use PaddlePaddle with GPU
version" from `enable_use_gpu` and then serves on the CPU, slower by the whole GPU speed-up. The engine reads what
its Config and Paddle report (predictor/paddle.py) into a `Placement`, and `placement_problem` turns a GPU asked
for and not used into a message that names the cause and what to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from skiff_runtime.settings import Device, RuntimeSettings, TensorRTPrecision

WHAT_TO_DO = (
    "serve this model from the GPU image (runtime/Dockerfile.gpu, a Paddle 3.x CUDA 12 build) on a node whose "
    "NVIDIA container runtime gives the pod its nvidia.com/gpu devices, or serve it with --device cpu"
)


class PlacedConfig(Protocol):
    """What a paddle.inference.Config reports about its device (a fake one in tests)."""

    def use_gpu(self) -> bool: ...
    def gpu_device_id(self) -> int: ...
    def tensorrt_engine_enabled(self) -> bool: ...


@dataclass(frozen=True)
class Placement:
    """What Paddle and the built Config say about the device a predictor runs on."""

    compiled_with_cuda: bool  # paddle.device.is_compiled_with_cuda()
    config_uses_gpu: bool  # Config.use_gpu() after enable_use_gpu
    visible_devices: int  # CUDA devices this process sees (CUDA_VISIBLE_DEVICES applied)
    config_device: int = 0  # Config.gpu_device_id()
    tensorrt_asked: bool = False  # --tensorrt-precision other than off
    tensorrt_enabled: bool = False  # Config.tensorrt_engine_enabled()
    cuda_visible_devices: str | None = None  # the variable, for the message

    def describe(self, device: Device) -> str:
        """One line for the load log: the device the predictor runs on."""
        if device.kind != "gpu" or not self.config_uses_gpu:
            return "cpu"
        return f"gpu:{self.config_device}" + (" (TensorRT)" if self.tensorrt_enabled else "")


def placement_problem(device: Device, placement: Placement) -> str | None:
    """None when the predictor runs where the settings asked; else why a GPU asked for is not used."""
    if device.kind != "gpu":
        return None
    asked = f"--device {device} was asked for"
    if not placement.compiled_with_cuda:
        return (
            f"{asked}, but this Paddle build has no CUDA (paddle.device.is_compiled_with_cuda() is False): the "
            f"predictor would run on the CPU. Install a paddlepaddle-gpu build: {WHAT_TO_DO}"
        )
    seen = placement.cuda_visible_devices
    shown = "unset" if seen is None else repr(seen)
    if placement.visible_devices == 0:
        return (
            f"{asked}, but no CUDA device is visible to this worker (CUDA_VISIBLE_DEVICES {shown}, "
            "0 devices): the pod has no GPU, or the NVIDIA driver is missing. Give the pod an nvidia.com/gpu limit "
            f"and run it on a GPU node: {WHAT_TO_DO}"
        )
    if device.index >= placement.visible_devices:
        return (
            f"{asked}, but this worker sees {placement.visible_devices} CUDA device(s) (CUDA_VISIBLE_DEVICES "
            f"{shown}): use --device gpu:0..{placement.visible_devices - 1}"
        )
    if not placement.config_uses_gpu:
        return (
            f"{asked}, but the Paddle Config does not use the GPU after enable_use_gpu (Config.use_gpu() is False): "
            f"the predictor would run on the CPU. {WHAT_TO_DO}"
        )
    if placement.tensorrt_asked and not placement.tensorrt_enabled:
        return (
            f"{asked} with TensorRT, but the Paddle Config has TensorRT off after enable_tensorrt_engine (a Paddle "
            "build without TensorRT): use a Paddle image with TensorRT, or serve with --tensorrt-precision off"
        )
    return None


def read_placement(
    config: PlacedConfig,
    settings: RuntimeSettings,
    compiled_with_cuda: bool,
    visible_devices: int,
    env: Mapping[str, str],
) -> Placement:
    """A built Config, read back (CPU settings read nothing: the GPU calls are never made there)."""
    gpu = settings.device.kind == "gpu"
    return Placement(
        compiled_with_cuda=compiled_with_cuda,
        config_uses_gpu=gpu and bool(config.use_gpu()),
        visible_devices=visible_devices,
        config_device=int(config.gpu_device_id()) if gpu else 0,
        tensorrt_asked=gpu and settings.tensorrt_precision is not TensorRTPrecision.OFF,
        tensorrt_enabled=gpu and bool(config.tensorrt_engine_enabled()),
        cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
    )
