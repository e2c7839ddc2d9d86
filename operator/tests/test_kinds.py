"""kinds: the one table of kinds holds every kind the operator renders, lists, watches or requests, and what the
rest of the operator derives from it (apply order, pruning, the child list, request paths) follows its rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from skiff_operator import kinds
from skiff_operator.errors import ApplyRejected
from skiff_operator.kube import collection_path
from skiff_operator.kube.client import child_path
from skiff_operator.kube.watches import list_functions
from skiff_operator.manifests import FIRST_KINDS, LAST_KINDS, render_all
from skiff_operator.routing import PRUNED_WHEN_NOT_RENDERED, PRUNED_WITH_THEIR_VERSION
from skiff_operator.spec import parse_inference_model
from tests.conftest import EXAMPLES_DIR, FAKE_UID, first_plan


def rendered_kinds() -> set[tuple[str, str]]:
    """(apiVersion, kind) of every manifest the examples' first reconciles render."""
    found = set()
    for path in sorted(EXAMPLES_DIR.glob("*.yaml")):
        body = yaml.safe_load(Path(path).read_text())
        body["metadata"].update(uid=FAKE_UID, generation=1)
        found |= {(m["apiVersion"], m["kind"]) for m in render_all(first_plan(parse_inference_model(body)))}
    return found


def test_every_rendered_kind_is_an_applied_row_of_the_table() -> None:
    rendered = rendered_kinds()
    assert {"Deployment", "Service", "NetworkPolicy", "PodDisruptionBudget", "Secret"} <= {k for _, k in rendered}
    for api_version, kind in rendered:
        row = kinds.BY_API_VERSION.get((api_version, kind))
        assert row is not None, f"{api_version} {kind} is rendered but has no row in kinds.KINDS"
        assert row.applied, kind


def test_each_kind_has_one_row() -> None:
    assert len(kinds.BY_KIND) == len(kinds.BY_API_VERSION) == len(kinds.KINDS)
    assert kinds.INFERENCE_MODEL.api_version == kinds.API_VERSION == "skiff.dev/v1alpha1"


def test_apply_order_and_pruning_are_read_from_the_rows() -> None:
    assert {"Secret", "Certificate"} == FIRST_KINDS
    assert {"GRPCRoute", "HTTPRoute"} == LAST_KINDS
    assert {"GRPCRoute", "HTTPRoute", "NetworkPolicy", "BackendTLSPolicy", "ConfigMap"} == PRUNED_WHEN_NOT_RENDERED
    assert {"PodDisruptionBudget"} == PRUNED_WITH_THEIR_VERSION


@pytest.mark.parametrize(
    ("routes", "backend_tls", "http_routes", "listed"),
    [
        (False, False, False, {"Deployment", "Service", "NetworkPolicy", "PodDisruptionBudget"}),
        (True, False, False, {"Deployment", "Service", "NetworkPolicy", "PodDisruptionBudget", "GRPCRoute"}),
        (True, False, True, {"Deployment", "Service", "NetworkPolicy", "PodDisruptionBudget", "GRPCRoute",
                             "HTTPRoute"}),
        (True, True, True, {"Deployment", "Service", "NetworkPolicy", "PodDisruptionBudget", "GRPCRoute", "HTTPRoute",
                            "BackendTLSPolicy", "ConfigMap"}),
    ],
)  # fmt: skip
def test_the_children_listed_depend_on_which_gateway_kinds_are_served(
    routes: bool, backend_tls: bool, http_routes: bool, listed: set[str]
) -> None:
    assert {
        k.kind for k in kinds.child_kinds(routes=routes, backend_tls=backend_tls, http_routes=http_routes)
    } == listed


def test_every_watched_kind_has_a_watch() -> None:
    assert set(list_functions(object())) == set(kinds.WATCHED_KINDS) == {"Pod", "Deployment", "Service"}  # type: ignore[arg-type]


def test_request_paths_come_from_the_rows_and_refuse_a_kind_without_one() -> None:
    assert (
        collection_path("policy/v1", "PodDisruptionBudget", "ml")
        == "/apis/policy/v1/namespaces/ml/poddisruptionbudgets"
    )
    assert collection_path("v1", "Pod", "ml") == "/api/v1/namespaces/ml/pods"
    assert child_path("GRPCRoute", "ml", "bert").endswith("/gateway.networking.k8s.io/v1/namespaces/ml/grpcroutes/bert")
    with pytest.raises(ApplyRejected, match="does not manage"):
        collection_path("batch/v1", "Job", "ml")  # a kind the table lacks: no request is built
    with pytest.raises(ApplyRejected, match="does not manage"):
        child_path("Pod", "ml", "bert-v1-abc")  # a kind the operator reads but never deletes as a child
