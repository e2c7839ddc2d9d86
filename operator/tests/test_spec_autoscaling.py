"""spec.autoscaling: merged per version over the model's block and the defaults; what the CRD refuses, refused."""

from __future__ import annotations

from typing import Any

import pytest

from skiff_operator.spec import Autoscaling, SpecError, parse_spec
from skiff_operator.spec.autoscaling import DEFAULT_MAX_REPLICAS

VERSIONS = [{"name": "v1", "modelUri": "pvc://m/1"}, {"name": "v2", "modelUri": "pvc://m/2"}]
TRAFFIC = [{"version": "v1", "percent": 90}, {"version": "v2", "percent": 10}]


def policies(spec: dict[str, Any]) -> dict[str, Autoscaling | None]:
    return {v.name: v.autoscaling for v in parse_spec({"traffic": TRAFFIC, **spec}).versions}


def test_without_a_block_no_version_is_autoscaled() -> None:
    assert policies({"versions": VERSIONS}) == {"v1": None, "v2": None}


def test_the_model_block_applies_to_every_version_with_the_defaults() -> None:
    assert policies({"versions": VERSIONS, "autoscaling": {"maxReplicas": 6}}) == {
        "v1": Autoscaling(max_replicas=6),
        "v2": Autoscaling(max_replicas=6),
    }
    assert Autoscaling().max_replicas == DEFAULT_MAX_REPLICAS
    assert Autoscaling().target_concurrency == 4.0


def test_a_version_overrides_field_by_field_and_may_opt_out() -> None:
    versions = [
        {**VERSIONS[0], "autoscaling": {"enabled": False}},
        {**VERSIONS[1], "autoscaling": {"scaleToZero": True, "targetConcurrency": 2.5}},
    ]
    assert policies({"versions": versions, "autoscaling": {"minReplicas": 2, "scaleDownWindowSeconds": 30}}) == {
        "v1": None,
        "v2": Autoscaling(min_replicas=2, target_concurrency=2.5, scale_down_window_s=30, scale_to_zero=True),
    }


def test_a_version_block_alone_autoscales_only_that_version() -> None:
    versions = [VERSIONS[0], {**VERSIONS[1], "autoscaling": {}}]
    assert policies({"versions": versions}) == {"v1": None, "v2": Autoscaling()}


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"minReplicas": 5, "maxReplicas": 2}, "minReplicas (5) must not exceed maxReplicas (2)"),
        ({"minReplicas": 0}, "minReplicas must be an integer from 1 to 64"),
        ({"maxReplicas": 65}, "maxReplicas must be an integer from 1 to 64"),
        ({"targetConcurrency": 0}, "targetConcurrency must be a number"),
        ({"targetConcurrency": True}, "targetConcurrency must be a number"),
        ({"scaleDownWindowSeconds": -1}, "scaleDownWindowSeconds must be an integer from 0 to 3600"),
        ({"scaleToZero": "yes"}, "scaleToZero must be true or false"),
        ({"targetCPUUtilization": 0}, "targetCPUUtilization must be an integer percentage from 1 to 1000"),
        ({"targetCPUUtilization": 70.5}, "targetCPUUtilization must be an integer percentage"),
        ({"targetGPUUtilization": 101}, "targetGPUUtilization must be an integer percentage from 1 to 100"),
        ({"maxReplica": 3}, "unknown fields ['maxReplica']"),
        ("fast", "spec.autoscaling must be an object"),
    ],
)
def test_a_bad_block_is_refused_saying_what_to_write(block: Any, message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        parse_spec({"versions": VERSIONS, "traffic": TRAFFIC, "autoscaling": block})


def test_the_merged_policy_is_checked_where_the_version_overrides() -> None:
    versions = [VERSIONS[0], {**VERSIONS[1], "autoscaling": {"maxReplicas": 1}}]
    with pytest.raises(SpecError, match=r"spec.versions\[v2\].autoscaling: minReplicas \(3\)"):
        parse_spec({"versions": versions, "traffic": TRAFFIC, "autoscaling": {"minReplicas": 3}})
    versions[1] = {**VERSIONS[1], "autoscaling": {"maxReplicas": 3}}
    assert parse_spec({"versions": versions, "traffic": TRAFFIC, "autoscaling": {"minReplicas": 3}})


def test_utilisation_targets_alone_leave_out_the_concurrency_target_and_written_beside_it_keep_it() -> None:
    cpu_only = policies({"versions": VERSIONS, "autoscaling": {"targetCPUUtilization": 70}})
    assert cpu_only["v1"] == Autoscaling(target_concurrency=None, target_cpu_utilization=70)
    both = [VERSIONS[0], {**VERSIONS[1], "autoscaling": {"targetConcurrency": 2, "targetGPUUtilization": 80}}]
    assert policies({"versions": both, "autoscaling": {"targetCPUUtilization": 70}}) == {
        "v1": Autoscaling(target_concurrency=None, target_cpu_utilization=70),
        "v2": Autoscaling(target_concurrency=2.0, target_cpu_utilization=70, target_gpu_utilization=80),
    }
    assert policies({"versions": VERSIONS, "autoscaling": {}})["v1"] == Autoscaling()  # concurrency 4 by default
