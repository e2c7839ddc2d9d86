"""Each invalid InferenceModel in operator/tests/invalid_examples.yaml is rejected by a real API server with its
expected message (CEL rules and OpenAPI schema checks alike), and nothing is created."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from devtools.cluster import REPO, Kubectl

INVALID_EXAMPLES: list[dict[str, Any]] = yaml.safe_load(
    (REPO / "operator" / "tests" / "invalid_examples.yaml").read_text()
)


def test_the_table_has_at_least_ten_cases_of_both_kinds() -> None:
    checks = [case["check"] for case in INVALID_EXAMPLES]
    assert len(checks) >= 10
    assert {"cel", "schema"} <= set(checks)


@pytest.fixture(scope="module")
def shared_namespace(kube: Kubectl, crd: dict[str, Any]) -> Iterator[str]:
    """One namespace for the whole table (rejections create nothing, so the cases cannot interfere)."""
    name = f"e2e-invalid-examples-{uuid.uuid4().hex[:6]}"
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    kube.run("delete", "namespace", name, "--wait=false")


@pytest.mark.parametrize("case", INVALID_EXAMPLES, ids=[case["id"] for case in INVALID_EXAMPLES])
def test_invalid_model_is_rejected_with_its_message(kube: Kubectl, shared_namespace: str, case: dict[str, Any]) -> None:
    body = copy.deepcopy(case["object"])
    body["metadata"]["namespace"] = shared_namespace
    done = kube.attempt("create", "-f", "-", stdin=yaml.safe_dump(body))
    assert done.returncode != 0, f"the API server accepted {case['id']}: {done.stdout}"
    error = " ".join(done.stderr.split())
    assert "is invalid" in error, error
    assert " ".join(case["message"].split()) in error
    if case["check"] == "schema":
        assert f"{case['field']}:" in error, f"the error does not name {case['field']}: {error}"
    name = body["metadata"]["name"]
    leftover = kube.attempt("get", "inferencemodel", name, "-n", shared_namespace)
    assert "NotFound" in leftover.stderr, f"{case['id']} left an object behind: {leftover.stdout}"
