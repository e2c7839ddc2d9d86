"""spec.rollout: parsed into frozen values with the CRD's defaults; specs the CRD's rules refuse are refused too."""

from __future__ import annotations

import re
from typing import Any

import pytest

from skiff_operator.spec import (
    Analysis,
    RolloutSpec,
    RolloutStep,
    SpecError,
    parse_duration,
    parse_inference_model,
    parse_spec,
)
from tests.fakes import defaulted

VERSIONS = [{"name": "v1", "modelUri": "pvc://m/1"}, {"name": "v2", "modelUri": "pvc://m/2"}]
TRAFFIC = [{"version": "v1", "percent": 100}, {"version": "v2", "percent": 0}]


def spec_with(rollout: Any, traffic: Any = None) -> dict[str, Any]:
    return {"versions": VERSIONS, "traffic": TRAFFIC if traffic is None else traffic, "rollout": rollout}


def test_no_rollout_parses_to_none() -> None:
    assert parse_spec({"versions": VERSIONS, "traffic": TRAFFIC}).rollout is None


def test_rollout_gets_the_documented_defaults() -> None:
    rollout = parse_spec(spec_with({"candidate": "v2", "steps": [{"weight": 5}, {"weight": 50, "pause": "1h2m3s"}]}))
    assert rollout.rollout == RolloutSpec(
        candidate="v2",
        steps=(RolloutStep(5, 60), RolloutStep(50, 3723)),
        analysis=Analysis(
            max_error_ratio=0.01,
            error_codes=frozenset({"UNAVAILABLE", "INTERNAL", "DEADLINE_EXCEEDED"}),
            max_p99_latency_ratio=2.0,
            min_requests=100,
        ),
        paused=False,
        abort=False,
    )


def test_analysis_fields_are_read() -> None:
    analysis = {"maxErrorRatio": 0, "errorCodes": ["INVALID_ARGUMENT"], "maxP99LatencyRatio": 1.25, "minRequests": 7}
    rollout = parse_spec(
        spec_with({"candidate": "v2", "steps": [{"weight": 10}], "analysis": analysis, "paused": True})
    )
    assert rollout.rollout is not None
    assert rollout.rollout.analysis == Analysis(0.0, frozenset({"INVALID_ARGUMENT"}), 1.25, 7)
    assert rollout.rollout.paused


@pytest.mark.parametrize(
    ("rollout", "traffic", "message"),
    [
        ({"candidate": "v3", "steps": [{"weight": 5}]}, None, "must name a version in spec.versions"),
        ({"candidate": "v2", "steps": [{"weight": 5}]}, [{"version": "v2", "percent": 100}], "needs a stable version"),
        ({"candidate": "v2", "steps": [{"weight": 50}, {"weight": 5}]}, None, "increase from step to step"),
        ({"candidate": "v2", "steps": [{"weight": 5}, {"weight": 5}]}, None, "increase from step to step"),
        ({"candidate": "v2", "steps": [{"weight": 101}]}, None, "increase from step to step"),
        ({"candidate": "v2", "steps": []}, None, "increase from step to step"),
        ({"candidate": "v2", "steps": [{"weight": 5, "pause": "2 min"}]}, None, "duration such as 30s"),
        ({"candidate": "v2", "steps": [{"weight": 5}], "analysis": {"maxErrorRatio": 2}}, None, "between 0 and 1"),
        ({"candidate": "v2", "steps": [{"weight": 5}], "analysis": {"errorCodes": ["OOPS"]}}, None, "gRPC code"),
        ({"candidate": "v2", "steps": [{"weight": 5}], "abort": "yes"}, None, "abort must be true or false"),
    ],
)
def test_bad_rollouts_are_refused_with_a_reason(rollout: Any, traffic: Any, message: str) -> None:
    with pytest.raises(SpecError, match=re.escape(message)):
        parse_spec(spec_with(rollout, traffic))


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("2m", 120), ("1h30m", 5400), ("0s", 0)])
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text, "pause") == seconds


@pytest.mark.parametrize("text", ["", "m", "2", "1m1h", "-1m", 5])
def test_bad_durations(text: Any) -> None:
    with pytest.raises(SpecError, match="duration"):
        parse_duration(text, "pause")


def test_the_crd_defaults_agree_with_the_parser_defaults() -> None:
    body = {
        "apiVersion": "skiff.dev/v1alpha1",
        "kind": "InferenceModel",
        "metadata": {"name": "demo", "namespace": "ml"},
        "spec": spec_with({"candidate": "v2", "steps": [{"weight": 5}]}),
    }
    filled = defaulted(body)
    assert filled["spec"]["rollout"]["analysis"]["errorCodes"] == ["UNAVAILABLE", "INTERNAL", "DEADLINE_EXCEEDED"]
    assert parse_inference_model(filled) == parse_inference_model(body)
