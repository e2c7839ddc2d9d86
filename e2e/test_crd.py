"""The CRD as a real API server serves it: installed, explained field by field, and printed with its columns."""

from __future__ import annotations

import re
from typing import Any

from devtools.cluster import Kubectl
from devtools.models import load_example


def _spec_schema(crd: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


def _words(text: str) -> str:
    return " ".join(text.split())


def test_crd_is_established_with_short_name_and_category(kube: Kubectl, crd: dict[str, Any]) -> None:
    served = kube.get("crd", "inferencemodels.skiff.dev")
    conditions = {c["type"]: c["status"] for c in served["status"]["conditions"]}
    assert conditions["Established"] == "True"
    assert conditions["NamesAccepted"] == "True"
    resources = kube.run("api-resources", "--api-group=skiff.dev", "-o", "wide")
    assert re.search(r"^inferencemodels\s+im\s+skiff.dev/v1alpha1\s+true\s+InferenceModel\b", resources, re.M), (
        resources
    )
    assert "skiff" in served["spec"]["names"]["categories"]


def test_explain_spec_prints_every_field_with_its_description(kube: Kubectl, crd: dict[str, Any]) -> None:
    explained = _words(kube.run("explain", "inferencemodel.spec"))
    spec = _spec_schema(crd)
    assert _words(spec["description"]) in explained
    for field, schema in spec["properties"].items():
        assert re.search(rf"\b{field}\s+<", explained), f"{field} missing from kubectl explain:\n{explained}"
        assert _words(schema["description"])[:80] in explained, f"the description of {field} is not shown"


def test_explain_reaches_nested_fields(kube: Kubectl, crd: dict[str, Any]) -> None:
    explained = _words(kube.run("explain", "inferencemodel.spec.versions.modelUri"))
    described = _spec_schema(crd)["properties"]["versions"]["items"]["properties"]["modelUri"]["description"]
    assert _words(described)[:80] in explained
    assert "FIELD: modelUri <string>" in explained


def test_get_shows_the_printer_columns(kube: Kubectl, crd: dict[str, Any], namespace: str) -> None:
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    default = [c["name"].upper() for c in columns if not c.get("priority")]
    wide = [c["name"].upper() for c in columns]
    kube.apply(load_example("cpu", namespace))
    header = kube.run("get", "im", "-n", namespace).splitlines()[0].split()
    assert header == ["NAME", *default]
    wide_header = kube.run("get", "im", "-n", namespace, "-o", "wide").splitlines()[0].split()
    assert wide_header == ["NAME", *wide]
    # The categories work too: `kubectl get skiff` lists InferenceModels.
    assert "inferencemodel.skiff.dev/sample-cnn-cpu" in kube.run("get", "skiff", "-n", namespace, "-o", "name")


def test_every_example_is_accepted_by_the_server(kube: Kubectl, crd: dict[str, Any], namespace: str) -> None:
    """The positive control for the rejection table: the same server accepts every shipped example."""
    for name in ("canary", "cpu", "gpu"):
        kube.apply(load_example(name, namespace), "--dry-run=server")
