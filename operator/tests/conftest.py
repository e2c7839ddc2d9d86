"""Fixtures for the operator's pure tests: the CRD, the example CRs and the API server's defaulting."""

from __future__ import annotations

import copy
import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from skiff_operator.model_status import Status, parse_status, render_status
from skiff_operator.observed import MetricsScrape
from skiff_operator.plan import Observed, Plan, make_plan
from skiff_operator.spec import InferenceModel
from skiff_operator.tls import TLSObserved

REPO = Path(__file__).resolve().parents[2]
CRD_PATH = REPO / "crds" / "skiff.dev_inferencemodels.yaml"
EXAMPLES_DIR = REPO / "manifests" / "examples"
FAKE_UID = "3f1c5a9e-0000-4000-8000-000000000001"
FIRST_PASS = datetime.datetime(2026, 5, 1, 12, 0, tzinfo=datetime.UTC)
OPERATOR_NAMESPACE = "skiff-system"  # manifests/install.yaml


def example_paths() -> list[Path]:
    return sorted(EXAMPLES_DIR.glob("*.yaml"))


def load_crd() -> dict[str, Any]:
    crd: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return crd


def crd_schema() -> dict[str, Any]:
    schema: dict[str, Any] = load_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Fills in `default:` values the way the API server does before validation (recursively, into defaults too)."""
    if isinstance(value, dict) and "properties" in schema:
        for key, sub in schema["properties"].items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = apply_defaults(sub, value[key])
    elif isinstance(value, list) and "items" in schema:
        return [apply_defaults(schema["items"], item) for item in value]
    return value


def stored_body(raw: dict[str, Any]) -> dict[str, Any]:
    """The object as the API server would store it: defaulted, with a uid and a generation."""
    body = apply_defaults(crd_schema(), copy.deepcopy(raw))
    body["metadata"].setdefault("uid", FAKE_UID)
    body["metadata"].setdefault("generation", 1)
    return body


@pytest.fixture
def make_body() -> Callable[..., dict[str, Any]]:
    """Builds a stored InferenceModel body; keyword arguments replace top-level spec fields."""

    def build(name: str = "demo", namespace: str = "ml", **spec: Any) -> dict[str, Any]:
        spec.setdefault("versions", [{"name": "v1", "modelUri": "pvc://models/demo/v1"}])
        raw = {
            "apiVersion": "skiff.dev/v1alpha1",
            "kind": "InferenceModel",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }
        return stored_body(raw)

    return build


def first_plan(model: InferenceModel, now: datetime.datetime = FIRST_PASS) -> Plan:
    """The plan of a model's first reconcile, as the operator installed by manifests/install.yaml makes it on a
    cluster without the Gateway API: nothing of the model exists yet (SelfSigned TLS issues its Secrets), and a
    rollout's first scrape finds no pods."""
    observed = Observed(
        TLSObserved(),
        scrape=MetricsScrape() if model.spec.rollout is not None else None,
        operator_namespace=OPERATOR_NAMESPACE,
    )
    plan = make_plan(model, observed, now)
    assert isinstance(plan, Plan), plan
    return plan


def wire(status: Status) -> dict[str, Any]:
    """`status` as the operator patches it. Every status a test looks at this way also makes the round trip a
    stored status makes: parsed back and rendered again, it is the same dict."""
    rendered = render_status(status)
    again = parse_status(rendered)
    assert again is not None
    assert render_status(again) == rendered, "render(parse(render(status))) differs from render(status)"
    return rendered
