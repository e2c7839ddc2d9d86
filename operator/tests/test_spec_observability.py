"""spec.observability.tracing and .payloadLogging: parsed into TracingSpec and PayloadLoggingSpec, refused with a
clear message when a value is not a URL, a ratio or in bounds, and the patterns and defaults the same as the
CRD's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from skiff_operator.errors import SpecError
from skiff_operator.spec.observability import (
    ENDPOINT_PATTERN,
    SINK_PATTERN,
    ObservabilitySpec,
    PayloadLoggingSpec,
    TracingSpec,
    parse_observability,
)

CRD = Path(__file__).resolve().parents[2] / "crds" / "skiff.dev_inferencemodels.yaml"


def test_no_observability_means_no_tracing() -> None:
    assert parse_observability(None) == ObservabilitySpec()
    assert parse_observability({}) == ObservabilitySpec(tracing=None)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"endpoint": "http://otel-collector.monitoring:4317"}, TracingSpec("http://otel-collector.monitoring:4317")),
        ({"endpoint": "https://c.example.com", "samplingRatio": 0.01}, TracingSpec("https://c.example.com", 0.01)),
        ({"endpoint": "http://10.0.0.7:4317", "samplingRatio": 0}, TracingSpec("http://10.0.0.7:4317", 0.0)),
        ({"endpoint": "http://[fd00::7]:4317", "samplingRatio": 1}, TracingSpec("http://[fd00::7]:4317", 1.0)),
    ],
)  # fmt: skip
def test_tracing_is_parsed(raw: dict[str, Any], expected: TracingSpec) -> None:
    assert parse_observability({"tracing": raw}).tracing == expected


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("yes", "spec.observability.tracing must be an object"),
        ({}, "endpoint must be the collector's OTLP/gRPC URL"),
        ({"endpoint": "otel-collector:4317"}, "endpoint must be the collector's OTLP/gRPC URL"),
        ({"endpoint": "http://collector:4317?x=$(rm -rf)"}, "endpoint must be the collector's OTLP/gRPC URL"),
        ({"endpoint": "http://" + "a" * 600}, "endpoint must be the collector's OTLP/gRPC URL"),
        ({"endpoint": "http://c:4317", "samplingRatio": 1.5}, "samplingRatio must be a number from 0 to 1"),
        ({"endpoint": "http://c:4317", "samplingRatio": True}, "samplingRatio must be a number from 0 to 1"),
        ({"endpoint": "http://c:4317", "samplingRatio": "0.5"}, "samplingRatio must be a number from 0 to 1"),
    ],
)
def test_bad_tracing_is_refused_with_what_to_write(raw: object, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_observability({"tracing": raw})


def test_the_endpoint_pattern_is_the_crds() -> None:
    schema = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    tracing = schema["properties"]["spec"]["properties"]["observability"]["properties"]["tracing"]
    assert tracing["properties"]["endpoint"]["pattern"] == ENDPOINT_PATTERN
    assert tracing["required"] == ["endpoint"]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({}, PayloadLoggingSpec(1.0, 65536, 100.0, "stdout")),
        ({"ratio": 0.01, "maxBodyBytes": 512, "maxPerSecond": 5, "sink": "https://logs.example.com/in"},
         PayloadLoggingSpec(0.01, 512, 5.0, "https://logs.example.com/in")),
    ],
)  # fmt: skip
def test_payload_logging_is_parsed(raw: dict[str, Any], expected: PayloadLoggingSpec) -> None:
    assert parse_observability({"payloadLogging": raw}) == ObservabilitySpec(payload_logging=expected)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("on", "payloadLogging must be an object"),
        ({"ratio": 2}, "ratio must be a number from 0 to 1"),
        ({"maxBodyBytes": 0}, "maxBodyBytes must be a whole number of bytes"),
        ({"maxBodyBytes": 1.5}, "maxBodyBytes must be a whole number of bytes"),
        ({"maxPerSecond": 0}, "maxPerSecond must be a number above 0"),
        ({"sink": "file:///var/log/x"}, "sink must be stdout or the http"),
        ({"sink": "stderr"}, "sink must be stdout or the http"),
    ],
)
def test_bad_payload_logging_is_refused_with_what_to_write(raw: object, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_observability({"payloadLogging": raw})


def test_the_payload_logging_schema_is_the_parsers() -> None:
    schema = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    logging = schema["properties"]["spec"]["properties"]["observability"]["properties"]["payloadLogging"]
    assert logging["properties"]["sink"]["pattern"] == SINK_PATTERN
    defaults = {key: value["default"] for key, value in logging["properties"].items()}
    assert parse_observability({"payloadLogging": defaults}) == parse_observability({"payloadLogging": {}})
