"""metrics: every visible GPU's NVML readings exported, labelled by index and UUID, on a fake NVML."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest

from skiff_runtime.metrics import RuntimeMetrics


@dataclass
class FakeNvml:
    """pynvml's calls the collector makes, over `count` GPUs with distinct readings."""

    count: int
    initialised: bool = False
    failing: int | None = None  # this index raises on read, as a GPU fallen off the bus does

    def nvmlInit(self) -> None:
        self.initialised = True

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        assert 0 <= index < self.count
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:
        return f"GPU-{handle:04d}-uuid".encode()

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        if handle == self.failing:
            raise RuntimeError("GPU is lost")
        return SimpleNamespace(gpu=10 * (handle + 1), memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(used=(handle + 1) << 30, total=80 << 30, free=0)


class NoDriver:
    def nvmlInit(self) -> None:
        raise RuntimeError("NVML Shared Library Not Found")


def _scrape(env: dict[str, str], nvml: object) -> str:
    metrics = RuntimeMetrics("m", "1")
    metrics.watch_gpus(env, nvml)
    return generate_latest(metrics.registry).decode()


def test_a_two_gpu_pod_exports_both_gpus_labelled_by_index_and_uuid() -> None:
    text = _scrape({}, FakeNvml(2))
    assert 'gpu_utilization{gpu="0",uuid="GPU-0000-uuid"} 10.0' in text
    assert 'gpu_utilization{gpu="1",uuid="GPU-0001-uuid"} 20.0' in text
    assert 'gpu_memory_used_bytes{gpu="1",uuid="GPU-0001-uuid"} 2.147483648e+09' in text
    assert text.count("gpu_memory_total_bytes{") == 2


@pytest.mark.parametrize(
    ("env", "exported"),
    [
        ({"CUDA_VISIBLE_DEVICES": "1"}, ["1"]),
        ({"CUDA_VISIBLE_DEVICES": "GPU-0002"}, ["2"]),
        ({"CUDA_VISIBLE_DEVICES": "2,0"}, ["2", "0"]),
        ({"CUDA_VISIBLE_DEVICES": ""}, []),
        ({"NVIDIA_VISIBLE_DEVICES": "GPU-0000-uuid,GPU-0002-uuid"}, ["0", "2"]),
        ({"NVIDIA_VISIBLE_DEVICES": "all"}, ["0", "1", "2"]),
        ({"NVIDIA_VISIBLE_DEVICES": "void"}, []),
    ],
)
def test_only_the_gpus_the_process_may_use_are_exported(env: dict[str, str], exported: list[str]) -> None:
    text = _scrape(env, FakeNvml(3))
    lines = [line for line in text.splitlines() if line.startswith("gpu_utilization{")]
    assert [line.split('"')[1] for line in lines] == exported


def test_a_gpu_that_fails_to_read_leaves_the_others_reported() -> None:
    text = _scrape({}, FakeNvml(2, failing=0))
    assert 'gpu_utilization{gpu="1",uuid="GPU-0001-uuid"} 20.0' in text
    assert 'gpu="0"' not in text


def test_no_driver_exports_no_gpu_metrics_and_the_rest_still_scrapes() -> None:
    text = _scrape({}, NoDriver())
    assert "gpu_utilization" not in text
    assert "skiff_model_ready" in text
