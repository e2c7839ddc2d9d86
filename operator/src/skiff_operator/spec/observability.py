"""spec.observability: what the model's runtime reports beyond its metrics. Today request traces: the OTLP/gRPC
collector they are sent to and the share of requests traced (the runtime's --trace-endpoint and
--trace-sampling-ratio, docs/observability.md)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skiff_operator.conditions import Reason
from skiff_operator.errors import SpecError

MAX_ENDPOINT_LENGTH = 512
# http(s)://host[:port][/path]: what the runtime's OTLP exporter dials (the CRD's pattern says the same).
ENDPOINT_PATTERN = r"^https?://[A-Za-z0-9.\-\[\]:]+(/[A-Za-z0-9._~/\-]*)?$"
DEFAULT_SAMPLING_RATIO = 1.0


@dataclass(frozen=True)
class TracingSpec:
    """spec.observability.tracing: every runtime pod sends its request spans to `endpoint`; `sampling_ratio` of
    the requests whose caller did not decide (no sampled traceparent) are traced."""

    endpoint: str
    sampling_ratio: float = DEFAULT_SAMPLING_RATIO


@dataclass(frozen=True)
class ObservabilitySpec:
    tracing: TracingSpec | None = None


def parse_observability(raw: Any) -> ObservabilitySpec:
    if raw is None:
        return ObservabilitySpec()
    if not isinstance(raw, Mapping):
        raise SpecError(Reason.INVALID_SPEC, "spec.observability must be an object")
    tracing = raw.get("tracing")
    if tracing is None:
        return ObservabilitySpec()
    if not isinstance(tracing, Mapping):
        raise SpecError(Reason.INVALID_SPEC, "spec.observability.tracing must be an object with an endpoint")
    endpoint = tracing.get("endpoint")
    if not isinstance(endpoint, str) or len(endpoint) > MAX_ENDPOINT_LENGTH or not re.match(ENDPOINT_PATTERN, endpoint):
        raise SpecError(
            Reason.INVALID_SPEC,
            "spec.observability.tracing.endpoint must be the collector's OTLP/gRPC URL, such as "
            "http://otel-collector.monitoring:4317",
        )
    ratio = tracing.get("samplingRatio", DEFAULT_SAMPLING_RATIO)
    if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 <= ratio <= 1:
        raise SpecError(
            Reason.INVALID_SPEC,
            "spec.observability.tracing.samplingRatio must be a number from 0 to 1 (1: every request)",
        )
    return ObservabilitySpec(TracingSpec(endpoint, float(ratio)))
