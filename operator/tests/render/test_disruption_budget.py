"""render.disruption_budget: one pod of a version at a time may be evicted, for versions of more than one replica."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from skiff_operator.render.deployment import render_deployment
from skiff_operator.render.disruption_budget import render_disruption_budget
from skiff_operator.spec import parse_inference_model

Body = Callable[..., dict[str, Any]]


@pytest.mark.parametrize("replicas", [2, 3, 10])
def test_a_version_of_several_replicas_gets_max_unavailable_one_on_exactly_its_deployments_pods(
    make_body: Body, replicas: int
) -> None:
    body = make_body(versions=[{"name": "v1", "modelUri": "pvc://models/a", "replicas": replicas},
                               {"name": "v2", "modelUri": "pvc://models/b", "replicas": 2}],
                     traffic=[{"version": "v1", "percent": 50}, {"version": "v2", "percent": 50}])  # fmt: skip
    model = parse_inference_model(body)
    version = model.spec.versions[0]
    budget = render_disruption_budget(model, version)
    assert budget is not None
    assert (budget["apiVersion"], budget["kind"]) == ("policy/v1", "PodDisruptionBudget")
    assert budget["metadata"]["name"] == "demo-v1"
    assert budget["metadata"]["namespace"] == "ml"
    assert budget["metadata"]["labels"]["skiff.dev/version"] == "v1"  # pruned with its version
    assert budget["metadata"]["ownerReferences"][0]["controller"] is True
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"  # a crash-looping version never blocks
    # The Deployment's own selector: the budget counts its pods and no other version's.
    assert budget["spec"]["selector"] == render_deployment(model, version)["spec"]["selector"]
    assert budget["spec"]["selector"]["matchLabels"] == {"skiff.dev/model": "demo", "skiff.dev/version": "v1"}


@pytest.mark.parametrize("replicas", [0, 1])
def test_a_version_of_one_replica_or_none_gets_no_budget(make_body: Body, replicas: int) -> None:
    body = make_body(versions=[{"name": "v1", "modelUri": "pvc://models/a", "replicas": replicas}])
    model = parse_inference_model(body)
    assert render_disruption_budget(model, model.spec.versions[0]) is None
