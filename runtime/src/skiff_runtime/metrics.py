"""Prometheus metrics of one runtime, in a registry of its own, served on the metrics port.

Names follow the conventions users already scrape: go-grpc-prometheus's `grpc_server_*`, Paddle Serving's
`paddle_inference_time_ms`, and NVML-backed `gpu_utilization` / `gpu_memory_used_bytes` for every visible GPU.
`skiff_cpu_seconds_total` is the CPU time of the runtime's process tree (workers included), which the operator's
CPU target divides by the pod's CPU request (docs/autoscaling.md).
Workers are processes, but batches are timed here in the front process, so no multiprocess mode is needed.
Times use SECONDS_BUCKETS: 10^(1/25) apart (9.6%), so a 10% slower version moves p50/p99 by at least a bucket.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pool
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from skiff_runtime.batching.batcher import BatchStats
from skiff_runtime.gpus import NvmlDevice, visible_gpus
from skiff_runtime.metrics_http import serve_metrics
from skiff_runtime.shadow.mirror import Tally

log = logging.getLogger(__name__)


def log_buckets(start: float, stop: float, per_decade: int) -> tuple[float, ...]:
    """Bounds from `start` to the first at or past `stop`, `per_decade` to each factor of ten (10^(1/n) apart),
    each at 4 significant digits, so every decade's ends are round: start*10, start*100, ... are bounds."""
    bounds: list[float] = []
    k = 0
    while not bounds or bounds[-1] < stop:
        bounds.append(float(f"{start * 10 ** (k / per_decade):.4g}"))
        k += 1
    return tuple(bounds)


# 0.5 ms to 60 s at a factor of 10^(1/25) = 1.0965: 128 bounds, and 0.005, 0.05, 0.5, 5 among them.
SECONDS_BUCKETS = log_buckets(0.0005, 60.0, 25)
MS_BUCKETS = tuple(float(f"{b * 1000:.4g}") for b in SECONDS_BUCKETS)
# Message sizes: 64 B to 1 GiB, a factor of 2 apart (25 bounds): enough to tell a tensor's shape changing.
SIZE_BUCKETS = tuple(float(1 << n) for n in range(6, 31))
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

# go-grpc-prometheus's names for the four kinds of RPC, by (client streams, server streams) in the .proto.
GRPC_TYPES = {
    (False, False): "unary",
    (True, False): "client_stream",
    (False, True): "server_stream",
    (True, True): "bidi_stream",
}


@functools.lru_cache(maxsize=128)  # the served methods: RpcObserver sees only methods a handler was registered for
def grpc_type(service: str, method: str) -> str:
    """The method's kind as its .proto declares it (go-grpc-prometheus's `grpc_type`), from the protobuf
    descriptors the generated modules registered: ModelInfer is "unary" on the wire whatever handler serves it.
    A method no descriptor names counts as "unary" (the only kind RpcObserver times)."""
    pool = descriptor_pool.Default()  # type: ignore[no-untyped-call]
    try:
        found = pool.FindMethodByName(f"{service}.{method}")
    except KeyError:
        return "unary"
    return GRPC_TYPES[(found.client_streaming, found.server_streaming)]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)  # older NVML bindings return bytes


def tree_cpu_seconds(root: int, stats: Mapping[int, str], ticks: float) -> float:
    """CPU seconds (user + system) of process `root` and every descendant, and of the children they reaped (a
    worker that was replaced), from their /proc/PID/stat lines (`stats`, by pid) at `ticks` clock ticks a second.
    A line that does not parse counts as nothing (a process that just left)."""
    parents: dict[int, int] = {}
    own: dict[int, int] = {}
    for pid, line in stats.items():
        fields = line[line.rfind(")") + 2 :].split()
        try:
            parents[pid] = int(fields[1])
            own[pid] = sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
        except (IndexError, ValueError):
            continue
    tree = {root} if root in own else set()
    grew = True
    while grew:
        children = {pid for pid, parent in parents.items() if parent in tree and pid not in tree}
        tree |= children
        grew = bool(children)
    return sum(own[pid] for pid in tree) / ticks


class CpuCollector(Collector):
    """`skiff_cpu_seconds_total`: tree_cpu_seconds of this process, read from `proc` at each scrape; nothing where
    /proc cannot be read."""

    def __init__(self, proc: Path = Path("/proc"), root: int | None = None) -> None:
        self.proc = proc
        self.root = os.getpid() if root is None else root
        self.ticks = float(os.sysconf("SC_CLK_TCK"))

    def collect(self) -> Iterator[CounterMetricFamily]:
        stats: dict[int, str] = {}
        try:
            entries = [entry for entry in self.proc.iterdir() if entry.name.isdigit()]
        except OSError:
            return
        for entry in entries:
            try:
                stats[int(entry.name)] = (entry / "stat").read_text()
            except OSError:
                continue  # gone between the listing and the read
        if self.root not in stats:
            return
        yield CounterMetricFamily(
            "skiff_cpu_seconds",
            "CPU seconds of the runtime's process and its workers (user + system)",
            value=tree_cpu_seconds(self.root, stats, self.ticks),
        )


# skiff_shadow_requests_total's results: the Tally field each counts.
SHADOW_RESULTS = ("agreed", "disagreed", "dropped", "failed")


class ShadowCollector(Collector):
    """`skiff_shadow_requests_total{candidate, result}`: what this (stable) runtime's mirror did with the copies it
    sampled for each candidate, and `skiff_shadow_output_disagreements_total{candidate, output}`: which outputs
    differed; read from the tallies (by candidate) at each scrape; nothing before any shadowing."""

    def __init__(self, tallies: Callable[[], Mapping[str, Tally]]) -> None:
        self.tallies = tallies

    def collect(self) -> Iterator[CounterMetricFamily]:
        tallies = self.tallies()
        if not tallies:
            return
        family = CounterMetricFamily(
            "skiff_shadow_requests",
            "Copies of answered requests sampled for a candidate version, by what became of them",
            labels=["candidate", "result"],
        )
        outputs = CounterMetricFamily(
            "skiff_shadow_output_disagreements",
            "Compared copies in which this output of the candidate did not agree",
            labels=["candidate", "output"],
        )
        for candidate, tally in sorted(tallies.items()):
            for result in SHADOW_RESULTS:
                family.add_metric([candidate, result], float(getattr(tally, result)))
            for output, count in sorted(tally.outputs.items()):
                outputs.add_metric([candidate, output], float(count))
        yield family
        yield outputs


class GpuCollector(Collector):
    """Utilization and memory of every GPU this process may use (gpus.visible_gpus), through NVML, labelled by
    NVML index (`gpu`) and UUID (`uuid`); yields nothing where no NVIDIA driver is present. `nvml` is the pynvml
    module (a fake one in tests)."""

    def __init__(self, env: Mapping[str, str] | None = None, nvml: Any = None) -> None:
        self._devices: list[tuple[NvmlDevice, object]] = []
        try:
            if nvml is None:
                import pynvml

                nvml = pynvml
            nvml.nvmlInit()
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
            listed = [NvmlDevice(i, _text(nvml.nvmlDeviceGetUUID(h))) for i, h in enumerate(handles)]
            chosen = visible_gpus(listed, os.environ if env is None else env)
            self._devices = [(d, handles[d.index]) for d in chosen]
            self._nvml = nvml
        except Exception as exc:  # no driver, no device: metrics simply absent
            log.info("NVML unavailable; no GPU metrics", extra={"reason": str(exc)})
            return
        log.info("GPU metrics", extra={"gpus": [f"{d.index}:{d.uuid}" for d, _ in self._devices]})

    @property
    def devices(self) -> tuple[NvmlDevice, ...]:
        return tuple(d for d, _ in self._devices)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if not self._devices:
            return
        labels = ["gpu", "uuid"]
        util = GaugeMetricFamily("gpu_utilization", "GPU busy percentage (NVML)", labels=labels)
        used = GaugeMetricFamily("gpu_memory_used_bytes", "GPU memory in use (NVML)", labels=labels)
        total = GaugeMetricFamily("gpu_memory_total_bytes", "GPU memory size (NVML)", labels=labels)
        for device, handle in self._devices:
            values = [str(device.index), device.uuid]
            try:
                utilization = self._nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception as exc:  # a GPU fallen off the bus: the others still report
                log.warning("NVML read failed", extra={"gpu": device.index, "error": str(exc)})
                continue
            util.add_metric(values, float(utilization.gpu))
            used.add_metric(values, float(memory.used))
            total.add_metric(values, float(memory.total))
        yield from (util, used, total)


class RuntimeMetrics:
    """Every metric the runtime exports."""

    def __init__(self, model: str, version: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"model": model, "version": version}
        r = self.registry
        self.handled = Counter(
            "grpc_server_handled_total",
            "RPCs completed, by method and status code",
            ["grpc_type", "grpc_service", "grpc_method", "grpc_code"],
            registry=r,
        )
        self.handling = Histogram(
            "grpc_server_handling_seconds",
            "RPC handling time",
            ["grpc_type", "grpc_service", "grpc_method"],
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.received_bytes = Histogram(
            "grpc_server_msg_received_bytes",
            "Size of the request message of an RPC",
            ["grpc_type", "grpc_service", "grpc_method"],
            buckets=SIZE_BUCKETS,
            registry=r,
        )
        self.sent_bytes = Histogram(
            "grpc_server_msg_sent_bytes",
            "Size of the response message of an RPC",
            ["grpc_type", "grpc_service", "grpc_method"],
            buckets=SIZE_BUCKETS,
            registry=r,
        )
        self.http_handled = Counter(
            "http_server_handled_total",
            "V2 REST requests completed, by route and HTTP status",
            ["route", "code"],
            registry=r,
        )
        self.http_handling = Histogram(
            "http_server_handling_seconds",
            "V2 REST request handling time",
            ["route"],
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.http_request_bytes = Histogram(
            "http_server_request_bytes",
            "V2 REST request body size (Content-Length)",
            ["route"],
            buckets=SIZE_BUCKETS,
            registry=r,
        )
        self.http_response_bytes = Histogram(
            "http_server_response_bytes", "V2 REST response body size", ["route"], buckets=SIZE_BUCKETS, registry=r
        )
        self.inference = Histogram(
            "skiff_inference_seconds", "Engine time per batch", buckets=SECONDS_BUCKETS, registry=r
        )
        self.inference_ms = Histogram(
            "paddle_inference_time_ms", "Engine time per batch in ms", buckets=MS_BUCKETS, registry=r
        )
        self.queue = Histogram(
            "skiff_queue_seconds", "Time the oldest request of a batch waited", buckets=SECONDS_BUCKETS, registry=r
        )
        self.batch_size = Histogram("skiff_batch_size", "Rows per batch", buckets=BATCH_BUCKETS, registry=r)
        self.batch_requests = Histogram(
            "skiff_batch_requests", "Requests merged per batch", buckets=BATCH_BUCKETS, registry=r
        )
        self.queue_depth = Gauge("skiff_queue_depth", "Requests waiting for a batch", registry=r)
        self.ready = Gauge(
            "skiff_model_ready", "1 when the model is loaded, warmed and serving", list(labels), registry=r
        )
        self.workers = Gauge("skiff_workers", "Inference worker processes able to run a batch", registry=r)
        self.engine_cache = Counter(
            "skiff_engine_cache",
            "Worker starts by how --trt-cache-dir served the engine: hit, waited (another built it), built, miss",
            ["result"],
            registry=r,
        )
        self.worker_exits = Counter(
            "skiff_worker_exits", "Worker processes that died or hung (each is replaced)", registry=r
        )
        self.request_bytes = Gauge(
            "skiff_request_bytes_held",
            "Bytes of request messages queued or running (--max-request-memory-mb)",
            registry=r,
        )
        self.payload_records = Counter(
            "skiff_payload_log_records",
            "Payload log records: written, dropped (queue full or sink failed), rate_limited, truncated (a body "
            "cut to --payload-log-max-body-bytes)",
            ["result"],
            registry=r,
        )
        self.shadow_served = Counter(
            "skiff_shadow_served",
            "Shadow copies (skiff-shadow: 1) answered, by gRPC code; not in grpc_server_*",
            ["grpc_code"],
            registry=r,
        )
        self._ready = self.ready.labels(**labels)
        self._ready.set(0)
        r.register(CpuCollector())

    def count_payload_records(self, result: str, count: int) -> None:
        self.payload_records.labels(result=result).inc(count)

    def set_ready(self, ready: bool) -> None:
        self._ready.set(1 if ready else 0)

    def track_queue_depth(self, depth: Callable[[], int]) -> None:
        self.queue_depth.set_function(lambda: float(depth()))

    def track_request_bytes(self, held: Callable[[], int]) -> None:
        self.request_bytes.set_function(lambda: float(held()))

    def observe_batch(self, stats: BatchStats) -> None:
        self.inference.observe(stats.run_seconds)
        self.inference_ms.observe(stats.run_seconds * 1000)
        self.queue.observe(stats.queue_seconds)
        self.batch_size.observe(stats.rows)
        self.batch_requests.observe(stats.requests)

    def observe_rpc(
        self, method: str, code: str, seconds: float, received: int | None = None, sent: int | None = None
    ) -> None:
        """One finished RPC (`/package.Service/Method`): its code and time, and its message sizes in bytes where
        known (None: no message was read, or none was sent)."""
        service, _, name = method.lstrip("/").rpartition("/")
        kind = grpc_type(service, name)
        self.handled.labels(kind, service, name, code).inc()
        self.handling.labels(kind, service, name).observe(seconds)
        if received is not None:
            self.received_bytes.labels(kind, service, name).observe(received)
        if sent is not None:
            self.sent_bytes.labels(kind, service, name).observe(sent)

    def observe_shadow_rpc(self, code: str) -> None:
        """One finished shadow copy (ModelInfer marked skiff-shadow): counted apart from user traffic."""
        self.shadow_served.labels(code).inc()

    def track_shadow(self, tallies: Callable[[], Mapping[str, Tally]]) -> None:
        self.registry.register(ShadowCollector(tallies))

    def observe_http(
        self, route: str, status: int, seconds: float, received: int | None = None, sent: int | None = None
    ) -> None:
        """One finished REST request: its status and time, and its body sizes in bytes where known."""
        self.http_handled.labels(route, str(status)).inc()
        self.http_handling.labels(route).observe(seconds)
        if received is not None:
            self.http_request_bytes.labels(route).observe(received)
        if sent is not None:
            self.http_response_bytes.labels(route).observe(sent)

    def watch_gpus(self, env: Mapping[str, str] | None = None, nvml: Any = None) -> GpuCollector:
        """Export every visible GPU's utilization and memory (GpuCollector)."""
        collector = GpuCollector(env, nvml)
        self.registry.register(collector)
        return collector

    def serve(self, host: str, port: int) -> int:
        """Start the /metrics HTTP server in a thread; returns the bound port."""
        server = serve_metrics(host, port, self.registry)  # bounded threads and idle time, see metrics_http
        return int(server.server_port)
