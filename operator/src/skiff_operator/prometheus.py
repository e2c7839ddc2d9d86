"""Reads the runtime's Prometheus text exposition into counters a rollout can compare: completed inference RPCs by
gRPC code and their handling-time histogram, summed over pods, subtracted between two reads. Pure.

A page is parsed as it streams (ExpositionReader): line by line under a byte cap and a line cap, keeping only the
counters below, so a reply costs at most one line of memory whatever its size.

Only these families matter, all from runtime/src/skiff_runtime/metrics.py, restricted to the inference methods:
`grpc_server_handled_total{grpc_method, grpc_code}` and `grpc_server_handling_seconds_bucket{grpc_method, le}` (the
rollout's gate), and the handling-time sums `grpc_server_handling_seconds_sum{grpc_method}` and
`http_server_handling_seconds_sum{route}` of the inference routes (autoscaling: their growth per second is the
average number of requests in flight, skiff_operator.autoscale), and for the utilisation targets of autoscaling
`skiff_cpu_seconds_total` (the CPU time of the runtime's container) and `gpu_utilization{gpu}` (NVML, per GPU).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

HANDLED = "grpc_server_handled_total"
HANDLING_BUCKET = "grpc_server_handling_seconds_bucket"
HANDLING_SUM = "grpc_server_handling_seconds_sum"
HTTP_HANDLING_SUM = "http_server_handling_seconds_sum"
CPU_SECONDS = "skiff_cpu_seconds_total"
SHADOW_REQUESTS = "skiff_shadow_requests_total"  # a stable pod's copies to a candidate, {candidate, result}
GPU_UTILIZATION = "gpu_utilization"
# The REST routes that run the model: the runtime labels a request with its canonical route.
INFERENCE_ROUTE_SUFFIX = "/infer"
# The RPCs that run the model (Open Inference Protocol and TF Serving); health and metadata RPCs do not count.
INFERENCE_METHODS = frozenset({"ModelInfer", "Predict"})
INF = "+Inf"

# Possessive quantifiers and quote-aware labels: no backtracking, so a hostile 4 KiB line costs microseconds (the
# earlier `\{(.*)\}` took 7 ms on a line of `} 1 ` repeated: 2 s of the event loop per 1 MiB page).
_SAMPLE = re.compile(
    r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*+)(?:\{(?P<labels>(?:[^"}]|"(?:[^"\\]|\\.)*+")*+)\})?'
    r"\s++(?P<value>\S++)(?:\s++-?[0-9]++)?+$"
)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*+)="((?:[^"\\]|\\.)*+)"')


class ExpositionError(ValueError):
    """A metrics page that is not the Prometheus text format (or not a Skiff runtime's). The message is the
    parser's own words and line number, never the page's content."""


class PageTooLarge(ExpositionError):
    """A page longer than the reader's byte cap."""


class LineTooLong(ExpositionError):
    """A line longer than the reader's line cap (the one part of a page the reader holds)."""


@dataclass(frozen=True)
class Counts:
    """Cumulative counters of one pod, or of several summed: inference RPCs by gRPC code, and the cumulative
    handling-time histogram by bucket upper bound (`le`, as exposed: "0.005", "+Inf"), and the seconds spent
    handling inference requests, gRPC and REST together (the histograms' sums)."""

    codes: Mapping[str, int] = field(default_factory=dict)
    buckets: Mapping[str, int] = field(default_factory=dict)
    handling_seconds: float = 0.0
    cpu_seconds: float = 0.0  # skiff_cpu_seconds_total, summed
    cpu_pods: int = 0  # the pages that had it (a runtime without a readable cgroup exports none)
    gpu_percent: float = 0.0  # gpu_utilization, summed over every GPU of every page
    gpus: int = 0  # the GPUs that summed
    shadow: Mapping[str, int] = field(default_factory=dict)  # "candidate/result" -> copies (SHADOW_REQUESTS)

    def shadow_of(self, candidate: str, result: str) -> int:
        return self.shadow.get(f"{candidate}/{result}", 0)

    @property
    def requests(self) -> int:
        return sum(self.codes.values())

    def errors(self, codes: Iterable[str]) -> int:
        return sum(self.codes.get(code, 0) for code in set(codes))


class ExpositionReader:
    """Parses a page as it arrives, chunk by chunk: each complete line is parsed and dropped, so it holds one
    partial line (at most `max_line_bytes`) and the counters of the two families, never the page. More than
    `max_bytes` in all is PageTooLarge, at the chunk that passes it."""

    def __init__(self, max_bytes: int, max_line_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.max_line_bytes = max_line_bytes
        self._read = 0
        self._partial = bytearray()
        self._number = 0
        self._codes: dict[str, int] = {}
        self._buckets: dict[str, int] = {}
        self._seconds = 0.0
        self._cpu: float | None = None
        self._gpu_percent = 0.0
        self._gpus = 0
        self._shadow: dict[str, int] = {}

    def feed(self, chunk: bytes) -> None:
        self._read += len(chunk)
        if self._read > self.max_bytes:
            raise PageTooLarge(f"the page is over {self.max_bytes} bytes")
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if self._partial:
                self._partial += chunk[start:end]
                self._line(bytes(self._partial))
                self._partial.clear()
            else:
                self._line(chunk[start:end])
            start = end + 1
        self._partial += chunk[start:]
        if len(self._partial) > self.max_line_bytes:
            raise LineTooLong(f"line {self._number + 1} is over {self.max_line_bytes} bytes")

    def close(self) -> Counts:
        """The counters of the whole page (its last line may lack a newline)."""
        if self._partial:
            self._line(bytes(self._partial))
            self._partial.clear()
        return Counts(
            dict(self._codes),
            dict(self._buckets),
            self._seconds,
            cpu_seconds=self._cpu or 0.0,
            cpu_pods=0 if self._cpu is None else 1,
            gpu_percent=self._gpu_percent,
            gpus=self._gpus,
            shadow=dict(self._shadow),
        )

    def _line(self, raw: bytes) -> None:
        self._number += 1
        if len(raw) > self.max_line_bytes:
            raise LineTooLong(f"line {self._number} is over {self.max_line_bytes} bytes")
        try:
            line = raw.decode("utf-8").strip()
        except UnicodeDecodeError as error:
            raise ExpositionError(f"line {self._number} is not UTF-8") from error
        if not line or line.startswith("#"):
            return
        match = _SAMPLE.match(line)
        if match is None:
            raise ExpositionError(f"line {self._number} is not a Prometheus sample")
        name = match.group("name")
        if name == CPU_SECONDS:
            self._cpu = (self._cpu or 0.0) + _seconds(match.group("value"), self._number)
            return
        if name == GPU_UTILIZATION:
            self._gpu_percent += _percent(match.group("value"), self._number)
            self._gpus += 1
            return
        if name not in (HANDLED, HANDLING_BUCKET, HANDLING_SUM, HTTP_HANDLING_SUM, SHADOW_REQUESTS):
            return
        labels = {key: _unescape(value) for key, value in _LABEL.findall(match.group("labels") or "")}
        if name == SHADOW_REQUESTS:
            key = f"{labels.get('candidate', '')}/{labels.get('result', '')}"
            self._shadow[key] = self._shadow.get(key, 0) + _count(match.group("value"), self._number)
            return
        if name == HTTP_HANDLING_SUM:
            if labels.get("route", "").endswith(INFERENCE_ROUTE_SUFFIX):
                self._seconds += _seconds(match.group("value"), self._number)
            return
        if labels.get("grpc_method") not in INFERENCE_METHODS:
            return
        if name == HANDLING_SUM:
            self._seconds += _seconds(match.group("value"), self._number)
            return
        value = _count(match.group("value"), self._number)
        if name == HANDLED:
            code = labels.get("grpc_code", "")
            self._codes[code] = self._codes.get(code, 0) + value
        else:
            bound = labels.get("le", "")
            self._buckets[bound] = self._buckets.get(bound, 0) + value


def parse_exposition(text: str) -> Counts:
    """The inference counters of one whole /metrics page; other families and methods are skipped."""
    reader = ExpositionReader(max_bytes=len(text.encode()), max_line_bytes=len(text.encode()))
    reader.feed(text.encode())
    return reader.close()


def add(counts: Iterable[Counts]) -> Counts:
    """The sum of several pods' counters (bucket bounds are the runtime's, the same on every pod)."""
    codes: dict[str, int] = {}
    buckets: dict[str, int] = {}
    seconds = cpu = gpu = 0.0
    cpu_pods = gpus = 0
    shadow: dict[str, int] = {}
    for item in counts:
        for key, value in item.shadow.items():
            shadow[key] = shadow.get(key, 0) + value
        for code, value in item.codes.items():
            codes[code] = codes.get(code, 0) + value
        for bound, value in item.buckets.items():
            buckets[bound] = buckets.get(bound, 0) + value
        seconds += item.handling_seconds
        cpu += item.cpu_seconds
        cpu_pods += item.cpu_pods
        gpu += item.gpu_percent
        gpus += item.gpus
    return Counts(
        codes, buckets, seconds, cpu_seconds=cpu, cpu_pods=cpu_pods, gpu_percent=gpu, gpus=gpus, shadow=shadow
    )


def subtract(now: Counts, before: Counts) -> Counts | None:
    """What happened between two reads; None when any counter went down (a pod restarted or went away), since
    the difference then means nothing."""
    codes = {code: now.codes.get(code, 0) - before.codes.get(code, 0) for code in {*now.codes, *before.codes}}
    buckets = {b: now.buckets.get(b, 0) - before.buckets.get(b, 0) for b in {*now.buckets, *before.buckets}}
    seconds = now.handling_seconds - before.handling_seconds
    if seconds < 0 or any(value < 0 for value in (*codes.values(), *buckets.values())):
        return None
    return Counts(codes, buckets, seconds)


def quantile(q: float, buckets: Mapping[str, int]) -> float | None:
    """Prometheus' histogram_quantile over cumulative buckets: linear within the bucket the rank falls in (from 0
    for the first bucket); the highest finite bound when it falls in +Inf. None without observations."""
    ordered = sorted((_bound(le), count) for le, count in buckets.items())
    if not ordered or ordered[-1][0] != math.inf or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    lower, below = 0.0, 0
    for upper, cumulative in ordered:
        if cumulative >= rank:
            if upper == math.inf:
                return lower
            inside = cumulative - below
            return lower + (upper - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = upper, cumulative
    return lower


def _bound(le: str) -> float:
    try:
        return float(le)
    except ValueError as error:
        raise ExpositionError("a histogram bucket bound is not a number") from error


def _count(value: str, number: int) -> int:
    try:
        parsed = float(value)
    except ValueError as error:
        raise ExpositionError(f"line {number}: the sample value is not a number") from error
    if not math.isfinite(parsed) or parsed < 0:  # round() of an infinity raises OverflowError
        raise ExpositionError(f"line {number}: a counter cannot be NaN, infinite or negative")
    return round(parsed)


def _seconds(value: str, number: int) -> float:
    try:
        parsed = float(value)
    except ValueError as error:
        raise ExpositionError(f"line {number}: the sample value is not a number") from error
    if not math.isfinite(parsed) or parsed < 0:
        raise ExpositionError(f"line {number}: a time sum cannot be NaN, infinite or negative")
    return parsed


def _percent(value: str, number: int) -> float:
    try:
        parsed = float(value)
    except ValueError as error:
        raise ExpositionError(f"line {number}: the sample value is not a number") from error
    if not 0 <= parsed <= 100:
        raise ExpositionError(f"line {number}: a GPU utilisation must be a percentage from 0 to 100")
    return parsed


def _unescape(value: str) -> str:
    return value.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")
