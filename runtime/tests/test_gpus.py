"""The pod's GPUs and the worker each one goes to: NVIDIA_VISIBLE_DEVICES and --gpus -> CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import pytest

from skiff_runtime.__main__ import plan_workers
from skiff_runtime.gpus import pod_gpus, worker_devices
from skiff_runtime.settings import Device, SettingsError, parse_settings


@pytest.mark.parametrize(
    ("visible", "count", "expected"),
    [
        ("GPU-aaa,GPU-bbb", 0, ("GPU-aaa", "GPU-bbb")),  # the device plugin's UUIDs are kept
        ("MIG-1,MIG-2,MIG-3", 2, ("MIG-1", "MIG-2")),  # --gpus takes the first N
        ("2,3", 0, ("0", "1")),  # node indexes are renumbered from 0 inside the container
        (" 5 , 7 ", 1, ("0",)),
        (None, 2, ("0", "1")),  # nothing listed: devices 0..N-1
        ("all", 3, ("0", "1", "2")),  # a CUDA base image's default names no device
        ("void", 0, ()),
        ("/var/run/nvidia-container-devices", 2, ("0", "1")),  # the volume-mounts strategy
        ("", 0, ()),
    ],
)
def test_pod_gpus_from_the_device_plugin_and_the_count(visible, count, expected) -> None:
    assert pod_gpus(visible, count) == expected


def test_pod_gpus_refuses_more_gpus_than_listed() -> None:
    with pytest.raises(ValueError, match=r"--gpus 3 but NVIDIA_VISIBLE_DEVICES lists 2 device\(s\)"):
        pod_gpus("GPU-a,GPU-b", 3)


@pytest.mark.parametrize(
    ("gpus", "workers", "expected"),
    [
        (("0", "1"), 2, ("0", "1")),
        (("0", "1"), 4, ("0", "1", "0", "1")),  # explicit --workers: the GPUs in turn
        (("GPU-a",), 1, ("GPU-a",)),
        ((), 3, ()),
    ],
)
def test_worker_devices_one_per_gpu_in_turn(gpus, workers, expected) -> None:
    assert worker_devices(gpus, workers) == expected


def _settings(*flags: str):
    return parse_settings(["--model-dir", "/m", "--model-name", "m", *flags], env={})


def test_plan_on_gpu_runs_one_worker_per_gpu_each_seeing_its_own_as_device_0() -> None:
    plan = plan_workers(_settings("--device", "gpu:0"), {"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b,GPU-c"})
    assert plan.count == 3
    assert [e["CUDA_VISIBLE_DEVICES"] for e in plan.environments] == ["GPU-a", "GPU-b", "GPU-c"]
    assert plan.settings.device == Device("gpu", 0)


def test_plan_with_gpus_and_no_listed_devices() -> None:
    plan = plan_workers(_settings("--device", "gpu", "--gpus", "2", "--workers", "4"), {})
    assert plan.count == 4
    assert [e["CUDA_VISIBLE_DEVICES"] for e in plan.environments] == ["0", "1", "0", "1"]


def test_plan_on_cpu_or_one_unnamed_gpu_sets_no_device() -> None:
    cpu = plan_workers(_settings("--workers", "2"), {"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"})
    assert (cpu.count, cpu.environments, cpu.settings.device) == (2, (), Device("cpu"))
    gpu = plan_workers(_settings("--device", "gpu:1"), {})  # no --gpus, nothing listed: as before, device 1
    assert (gpu.count, gpu.environments, gpu.settings.device) == (1, (), Device("gpu", 1))


def test_plan_refuses_more_gpus_than_the_pod_has() -> None:
    with pytest.raises(SettingsError, match="lower --gpus"):
        plan_workers(_settings("--device", "gpu", "--gpus", "4"), {"NVIDIA_VISIBLE_DEVICES": "GPU-a"})
