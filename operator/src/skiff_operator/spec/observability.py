"""spec.observability: what the model's runtime reports beyond its metrics: request traces (the OTLP/gRPC collector
they are sent to and the share of requests traced: the runtime's --trace-endpoint and --trace-sampling-ratio) and
payload logging (the share of requests logged, the bytes kept of each body, the lines a second, and the sink:
the runtime's --payload-log-* options), docs/observability.md."""

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
# spec.observability.payloadLogging's defaults and bounds (the CRD says the same).
DEFAULT_PAYLOAD_RATIO = 1.0
DEFAULT_MAX_BODY_BYTES = 65536
MAX_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_PER_SECOND = 100.0
MAX_PER_SECOND = 100000
STDOUT = "stdout"
# stdout, or an http(s) URL that takes POSTed JSON lines (the CRD's pattern says the same).
SINK_PATTERN = r"^(stdout|https?://[A-Za-z0-9.\-\[\]:]+(/[A-Za-z0-9._~/\-]*)?)$"


@dataclass(frozen=True)
class TracingSpec:
    """spec.observability.tracing: every runtime pod sends its request spans to `endpoint`; `sampling_ratio` of
    the requests whose caller did not decide (no sampled traceparent) are traced."""

    endpoint: str
    sampling_ratio: float = DEFAULT_SAMPLING_RATIO


@dataclass(frozen=True)
class PayloadLoggingSpec:
    """spec.observability.payloadLogging: `ratio` of the inference requests are logged with their response as OIP
    JSON lines, each body cut to `max_body_bytes`, at most `max_per_second` lines a second, written to `sink`."""

    ratio: float = DEFAULT_PAYLOAD_RATIO
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_per_second: float = DEFAULT_MAX_PER_SECOND
    sink: str = STDOUT


@dataclass(frozen=True)
class ObservabilitySpec:
    tracing: TracingSpec | None = None
    payload_logging: PayloadLoggingSpec | None = None


def _number(raw: Mapping[str, Any], key: str, default: float, low: float, high: float, what: str) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise SpecError(Reason.INVALID_SPEC, f"spec.observability.payloadLogging.{key} must be {what}")
    return float(value)


def parse_payload_logging(raw: Any) -> PayloadLoggingSpec | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise SpecError(
            Reason.INVALID_SPEC, "spec.observability.payloadLogging must be an object, such as {ratio: 0.01}"
        )
    ratio = _number(raw, "ratio", DEFAULT_PAYLOAD_RATIO, 0, 1, "a number from 0 to 1 (1: every request)")
    body = raw.get("maxBodyBytes", DEFAULT_MAX_BODY_BYTES)
    if isinstance(body, bool) or not isinstance(body, int) or not 1 <= body <= MAX_BODY_BYTES:
        raise SpecError(
            Reason.INVALID_SPEC,
            "spec.observability.payloadLogging.maxBodyBytes must be a whole number of bytes from 1 to "
            f"{MAX_BODY_BYTES}",
        )
    rate_bounds = f"a number above 0, at most {MAX_PER_SECOND}"
    rate = _number(raw, "maxPerSecond", DEFAULT_MAX_PER_SECOND, 0.001, MAX_PER_SECOND, rate_bounds)
    sink = raw.get("sink", STDOUT)
    if not isinstance(sink, str) or len(sink) > MAX_ENDPOINT_LENGTH or not re.match(SINK_PATTERN, sink):
        raise SpecError(
            Reason.INVALID_SPEC,
            "spec.observability.payloadLogging.sink must be stdout or the http(s) URL that takes the JSON lines, "
            "such as http://log-collector.monitoring:8080/payloads",
        )
    return PayloadLoggingSpec(ratio, body, rate, sink)


def parse_observability(raw: Any) -> ObservabilitySpec:
    if raw is None:
        return ObservabilitySpec()
    if not isinstance(raw, Mapping):
        raise SpecError(Reason.INVALID_SPEC, "spec.observability must be an object")
    payload_logging = parse_payload_logging(raw.get("payloadLogging"))
    tracing = raw.get("tracing")
    if tracing is None:
        return ObservabilitySpec(payload_logging=payload_logging)
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
    return ObservabilitySpec(TracingSpec(endpoint, float(ratio)), payload_logging)
