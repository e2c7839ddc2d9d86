"""predictor.placement: a GPU asked for and not used is refused with its cause, on a fake Config (no GPU)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from skiff_runtime.predictor.placement import placement_problem, read_placement
from skiff_runtime.settings import RuntimeSettings, parse_settings


@dataclass
class FakeConfig:
    """What a paddle.inference.Config reports after the config plan's calls."""

    gpu: bool = True
    device: int = 0
    tensorrt: bool = False

    def use_gpu(self) -> bool:
        return self.gpu

    def gpu_device_id(self) -> int:
        return self.device

    def tensorrt_engine_enabled(self) -> bool:
        return self.tensorrt


def _settings(*flags: str) -> RuntimeSettings:
    return parse_settings(["--model-dir", "/m", "--model-name", "m", *flags], env={})


def _problem(config: FakeConfig, *flags: str, cuda: bool = True, devices: int = 1, env: dict[str, str] | None = None):
    settings = _settings(*flags)
    return placement_problem(settings.device, read_placement(config, settings, cuda, devices, env or {}))


def test_a_gpu_config_on_a_cuda_build_with_a_device_is_accepted() -> None:
    assert _problem(FakeConfig(), "--device", "gpu:0") is None
    assert _problem(FakeConfig(tensorrt=True), "--device", "gpu:0", "--tensorrt-precision", "fp16") is None


def test_cpu_settings_are_never_refused_even_on_a_build_without_cuda() -> None:
    assert _problem(FakeConfig(gpu=False), cuda=False, devices=0) is None


@pytest.mark.parametrize(
    ("config", "cuda", "devices", "flags", "cause"),
    [
        (FakeConfig(gpu=False), False, 0, (), "this Paddle build has no CUDA"),
        (FakeConfig(), True, 0, (), "no CUDA device is visible"),
        (FakeConfig(), True, 1, ("--device", "gpu:1"), "sees 1 CUDA device(s)"),
        (FakeConfig(gpu=False), True, 1, (), "Config.use_gpu() is False"),
        (FakeConfig(tensorrt=False), True, 1, ("--tensorrt-precision", "fp16"), "TensorRT off"),
    ],
    ids=["no-cuda-build", "no-device", "device-out-of-range", "config-on-cpu", "no-tensorrt"],
)
def test_a_gpu_asked_for_and_not_used_is_refused_with_its_cause(
    config: FakeConfig, cuda: bool, devices: int, flags: tuple[str, ...], cause: str
) -> None:
    problem = _problem(config, *(flags if "--device" in flags else ("--device", "gpu:0", *flags)), cuda=cuda,
                       devices=devices)  # fmt: skip
    assert problem is not None
    assert cause in problem
    assert "--device" in problem  # what was asked
    assert "--device cpu" in problem or "--device gpu:0" in problem or "--tensorrt-precision off" in problem


def test_the_message_shows_cuda_visible_devices_as_the_worker_saw_it() -> None:
    problem = _problem(FakeConfig(), "--device", "gpu:0", devices=0, env={"CUDA_VISIBLE_DEVICES": "GPU-abc"})
    assert problem is not None
    assert "CUDA_VISIBLE_DEVICES 'GPU-abc'" in problem


def test_describe_names_the_device_the_predictor_runs_on() -> None:
    settings = _settings("--device", "gpu:0", "--tensorrt-precision", "fp16")
    on_gpu = read_placement(FakeConfig(tensorrt=True), settings, True, 1, {})
    assert on_gpu.describe(settings.device) == "gpu:0 (TensorRT)"
    on_cpu = read_placement(FakeConfig(gpu=False), _settings(), False, 0, {})
    assert on_cpu.describe(_settings().device) == "cpu"
