"""Reads the runtime's Prometheus text exposition into counters a rollout can compare: completed inference RPCs by
gRPC code and their handling-time histogram, summed over pods, subtracted between two reads. Pure.

Only two families matter, both from runtime/src/skiff_runtime/metrics.py, restricted to the inference methods:
`grpc_server_handled_total{grpc_method, grpc_code}` and `grpc_server_handling_seconds_bucket{grpc_method, le}`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

HANDLED = "grpc_server_handled_total"
HANDLING_BUCKET = "grpc_server_handling_seconds_bucket"
# The RPCs that run the model (Open Inference Protocol and TF Serving); health and metadata RPCs do not count.
INFERENCE_METHODS = frozenset({"ModelInfer", "Predict"})
INF = "+Inf"

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+-?[0-9]+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


class ExpositionError(ValueError):
    """A metrics page that is not the Prometheus text format (or not a Skiff runtime's)."""


@dataclass(frozen=True)
class Counts:
    """Cumulative counters of one pod, or of several summed: inference RPCs by gRPC code, and the cumulative
    handling-time histogram by bucket upper bound (`le`, as exposed: "0.005", "+Inf")."""

    codes: Mapping[str, int] = field(default_factory=dict)
    buckets: Mapping[str, int] = field(default_factory=dict)

    @property
    def requests(self) -> int:
        return sum(self.codes.values())

    def errors(self, codes: Iterable[str]) -> int:
        return sum(self.codes.get(code, 0) for code in set(codes))


def parse_exposition(text: str) -> Counts:
    """The inference counters of one /metrics page; other families and methods are skipped."""
    codes: dict[str, int] = {}
    buckets: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise ExpositionError(f"line {number} is not a Prometheus sample: {line[:120]!r}")
        name = match.group("name")
        if name not in (HANDLED, HANDLING_BUCKET):
            continue
        labels = {key: _unescape(value) for key, value in _LABEL.findall(match.group("labels") or "")}
        if labels.get("grpc_method") not in INFERENCE_METHODS:
            continue
        value = _count(match.group("value"), number)
        if name == HANDLED:
            code = labels.get("grpc_code", "")
            codes[code] = codes.get(code, 0) + value
        else:
            bound = labels.get("le", "")
            buckets[bound] = buckets.get(bound, 0) + value
    return Counts(codes, buckets)


def add(counts: Iterable[Counts]) -> Counts:
    """The sum of several pods' counters (bucket bounds are the runtime's, the same on every pod)."""
    codes: dict[str, int] = {}
    buckets: dict[str, int] = {}
    for item in counts:
        for code, value in item.codes.items():
            codes[code] = codes.get(code, 0) + value
        for bound, value in item.buckets.items():
            buckets[bound] = buckets.get(bound, 0) + value
    return Counts(codes, buckets)


def subtract(now: Counts, before: Counts) -> Counts | None:
    """What happened between two reads; None when any counter went down (a pod restarted or went away), since
    the difference then means nothing."""
    codes = {code: now.codes.get(code, 0) - before.codes.get(code, 0) for code in {*now.codes, *before.codes}}
    buckets = {b: now.buckets.get(b, 0) - before.buckets.get(b, 0) for b in {*now.buckets, *before.buckets}}
    if any(value < 0 for value in (*codes.values(), *buckets.values())):
        return None
    return Counts(codes, buckets)


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
        raise ExpositionError(f"histogram bucket bound {le!r} is not a number") from error


def _count(value: str, number: int) -> int:
    try:
        parsed = float(value)
    except ValueError as error:
        raise ExpositionError(f"line {number}: sample value {value!r} is not a number") from error
    if math.isnan(parsed) or parsed < 0:
        raise ExpositionError(f"line {number}: a counter cannot be {value}")
    return round(parsed)


def _unescape(value: str) -> str:
    return value.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")


@dataclass(frozen=True)
class MetricsScrape:
    """One read of the metrics ports of a model's pods: counters per version (summed over its running pods;
    empty for a version with none), and per version why some pod could not be read."""

    counts: Mapping[str, Counts] = field(default_factory=dict)
    problems: Mapping[str, str] = field(default_factory=dict)

    def side(self, versions: Iterable[str]) -> tuple[Counts | None, str]:
        """The counters of `versions` together, or None and why when one of them could not be read fully."""
        wanted = list(versions)
        problems = [f"{version}: {self.problems[version]}" for version in wanted if version in self.problems]
        if problems:
            return None, "; ".join(problems)
        return add(self.counts.get(version, Counts()) for version in wanted), ""
