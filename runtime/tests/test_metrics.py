"""metrics: every visible GPU's NVML readings exported, labelled by index and UUID, on a fake NVML; latency
buckets fine enough to tell 10% apart; the RPC kind as the .proto declares it; message sizes; the page's size."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from grpc_health.v1 import health_pb2  # noqa: F401  (registers grpc.health.v1's descriptors)
from prometheus_client import generate_latest

from skiff_runtime.batching.batcher import BatchStats
from skiff_runtime.metrics import (
    MS_BUCKETS,
    SECONDS_BUCKETS,
    SIZE_BUCKETS,
    RuntimeMetrics,
    grpc_type,
    log_buckets,
    tree_cpu_seconds,
)
from skiff_runtime.proto import inference_pb2  # noqa: F401  (registers inference's descriptors)

INFER = "/inference.GRPCInferenceService/ModelInfer"


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


def test_latency_buckets_tell_a_10_percent_difference_from_half_a_millisecond_to_a_minute() -> None:
    ratios = [b / a for a, b in itertools.pairwise(SECONDS_BUCKETS)]
    assert SECONDS_BUCKETS[0] == 0.0005
    assert SECONDS_BUCKETS[-1] >= 60 > SECONDS_BUCKETS[-2]
    assert all(1.09 < r < 1.1 for r in ratios), (min(ratios), max(ratios))
    assert {0.005, 0.05, 0.5, 5.0} <= set(SECONDS_BUCKETS)  # round bounds the old dashboards and tests name
    assert MS_BUCKETS[:3] == (0.5, 0.5482, 0.6011)
    assert log_buckets(1, 10, 2) == (1.0, 3.162, 10.0)
    assert SIZE_BUCKETS[0] == 64
    assert SIZE_BUCKETS[-1] == 1 << 30


@pytest.mark.parametrize(
    ("service", "method", "kind"),
    [
        ("inference.GRPCInferenceService", "ModelInfer", "unary"),  # served client-streaming, declared unary
        ("grpc.health.v1.Health", "Check", "unary"),
        ("grpc.health.v1.Health", "Watch", "server_stream"),
        ("no.such.Service", "Call", "unary"),
    ],
)
def test_the_grpc_type_is_the_kind_the_proto_declares(service: str, method: str, kind: str) -> None:
    assert grpc_type(service, method) == kind


def test_an_rpc_is_counted_with_its_type_and_its_message_sizes() -> None:
    metrics = RuntimeMetrics("m", "1")
    metrics.observe_rpc(INFER, "OK", 0.004, 1000, 300)
    metrics.observe_rpc(INFER, "INVALID_ARGUMENT", 0.001, 70, None)  # refused: no response message
    text = generate_latest(metrics.registry).decode()
    labels = 'grpc_method="ModelInfer",grpc_service="inference.GRPCInferenceService",grpc_type="unary"'
    assert f'grpc_server_handled_total{{grpc_code="OK",{labels}}} 1.0' in text
    assert f"grpc_server_msg_received_bytes_sum{{{labels}}} 1070.0" in text
    assert f"grpc_server_msg_sent_bytes_count{{{labels}}} 1.0" in text
    assert f'grpc_server_msg_received_bytes_bucket{{{labels},le="1024.0"}} 2.0' in text
    assert f'grpc_server_handling_seconds_bucket{{{labels},le="0.005"}} 2.0' in text


def test_a_rest_request_is_counted_with_its_body_sizes_where_known() -> None:
    metrics = RuntimeMetrics("m", "1")
    metrics.observe_http("/v2/models/{model}/infer", 200, 0.01, 2048, 512)
    metrics.observe_http("/v2/health/live", 200, 0.0001, None, 0)  # a GET has no body
    text = generate_latest(metrics.registry).decode()
    assert 'http_server_request_bytes_sum{route="/v2/models/{model}/infer"} 2048.0' in text
    assert 'http_server_response_bytes_sum{route="/v2/models/{model}/infer"} 512.0' in text
    assert 'http_server_request_bytes_count{route="/v2/health/live"}' not in text
    assert 'http_server_response_bytes_count{route="/v2/health/live"} 1.0' in text


def test_a_busy_runtimes_page_stays_small_enough_to_scrape() -> None:
    """Every gRPC method and REST route a runtime answers, each seen once, with both error and success codes:
    the page grows with series, not with traffic. Printed for docs/observability.md."""
    metrics = RuntimeMetrics("a-model-name-of-some-length", "v1")
    methods = [f"/inference.GRPCInferenceService/{m}" for m in ("ModelInfer", "ModelReady", "ModelMetadata")]
    methods += ["/inference.GRPCInferenceService/ServerReady", "/tensorflow.serving.PredictionService/Predict"]
    for method in methods:
        for code in ("OK", "INVALID_ARGUMENT", "UNAVAILABLE"):
            metrics.observe_rpc(method, code, 0.003, 4096, 4096)
    for route in ("/v2/models/{model}/infer", "/v2/models/{model}/ready", "/v2/health/ready"):
        metrics.observe_http(route, 200, 0.003, 4096, 4096)
    metrics.observe_batch(BatchStats(requests=2, rows=4, queue_seconds=0.001, run_seconds=0.002))
    size = len(generate_latest(metrics.registry))
    print(f"metrics page: {size} bytes")
    assert 100_000 < size < 256 * 1024  # the operator's rollout read takes up to 1 MiB


def stat(pid: int, parent: int, utime: int, stime: int, cutime: int = 0, cstime: int = 0, name: str = "x") -> str:
    """A /proc/PID/stat line (fields 1-17; the kernel writes more)."""
    return f"{pid} ({name}) S {parent} 1 1 0 -1 4194560 10 0 0 0 {utime} {stime} {cutime} {cstime}"


def test_cpu_seconds_count_the_process_its_workers_and_what_they_reaped_but_no_one_else() -> None:
    stats = {
        10: stat(10, 1, 100, 50, cutime=30, cstime=20),  # the runtime; a replaced worker's 50 ticks reaped
        11: stat(11, 10, 400, 100, name="worker (a) b"),  # a worker, with a name that has ') ' in it
        12: stat(12, 11, 10, 0),  # a worker's own child
        20: stat(20, 1, 9999, 9999),  # another process of the pod (or host): not ours
        13: "13 (gone",  # read as it left
    }
    assert tree_cpu_seconds(10, stats, ticks=100) == (150 + 50 + 500 + 10) / 100
    assert tree_cpu_seconds(99, stats, ticks=100) == 0


def test_this_process_exports_its_cpu_seconds_and_they_grow_with_work() -> None:
    metrics = RuntimeMetrics("m", "1")

    def exported() -> float:
        value = metrics.registry.get_sample_value("skiff_cpu_seconds_total")
        assert value is not None
        return value

    before = exported()
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    assert exported() - before >= 0.2


def test_shadow_counts_are_exported_per_candidate_result_and_differing_output() -> None:
    from skiff_runtime.shadow.mirror import Tally

    metrics = RuntimeMetrics("m", "v1")
    tallies = {"v2": Tally(agreed=7, disagreed=3, dropped=2, failed=1, outputs={"probs": 3, "label": 1})}
    metrics.track_shadow(lambda: tallies)
    page = generate_latest(metrics.registry).decode()
    for line in (
        'skiff_shadow_requests_total{candidate="v2",result="agreed"} 7.0',
        'skiff_shadow_requests_total{candidate="v2",result="disagreed"} 3.0',
        'skiff_shadow_requests_total{candidate="v2",result="dropped"} 2.0',
        'skiff_shadow_requests_total{candidate="v2",result="failed"} 1.0',
        'skiff_shadow_output_disagreements_total{candidate="v2",output="probs"} 3.0',
        'skiff_shadow_output_disagreements_total{candidate="v2",output="label"} 1.0',
    ):
        assert line in page.splitlines()
    metrics.observe_shadow_rpc("OK")
    assert 'skiff_shadow_served_total{grpc_code="OK"} 1.0' in generate_latest(metrics.registry).decode()
