"""traffic_status: the split the ready pods give in Service mode, and whether replicas can represent spec.traffic."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from skiff_operator.routing import Mode
from skiff_operator.spec import parse_inference_model
from skiff_operator.traffic_status import pod_split, split_approximation

Body = Callable[..., dict[str, Any]]


@pytest.mark.parametrize(
    ("ready", "split"),
    [
        ({"v1": 3, "v2": 1}, {"v1": 75, "v2": 25}),
        ({"v1": 1, "v2": 1}, {"v1": 50, "v2": 50}),
        ({"v1": 2, "v2": 1}, {"v1": 67, "v2": 33}),  # largest remainder: always sums to 100
        ({"v1": 1, "v2": 1, "v3": 1}, {"v1": 34, "v2": 33, "v3": 33}),
        ({"v1": 4, "v2": 0}, {"v1": 100, "v2": 0}),
        ({"v1": 0, "v2": 0}, {"v1": 0, "v2": 0}),  # nothing ready: nothing served
    ],
)
def test_pod_split_is_each_versions_share_of_the_ready_pods(ready: dict[str, int], split: dict[str, int]) -> None:
    assert pod_split(ready) == split


def _model(make_body: Body, replicas: tuple[int, int], traffic: tuple[int, int]) -> Any:
    versions = [
        {"name": n, "modelUri": f"pvc://m/{n}", "replicas": r} for n, r in zip(("v1", "v2"), replicas, strict=True)
    ]
    shares = [{"version": n, "percent": p} for n, p in zip(("v1", "v2"), traffic, strict=True)]
    return parse_inference_model(make_body(versions=versions, traffic=shares))


@pytest.mark.parametrize(
    ("replicas", "traffic", "status", "reason", "message"),
    [
        ((3, 1), (90, 10), "True", "ReplicaRounding", "desired v1=90,v2=10, 4 pods give v1=75,v2=25: off by up to 15"),
        ((1, 1), (90, 10), "True", "ReplicaRounding", "desired v1=90,v2=10, 2 pods give v1=50,v2=50: off by up to 40"),
        ((9, 1), (90, 10), "False", "ReplicasGiveSplit", "desired v1=90,v2=10, 10 pods give v1=90,v2=10"),
        ((3, 1), (75, 25), "False", "ReplicasGiveSplit", "desired v1=75,v2=25, 4 pods give v1=75,v2=25"),
        ((2, 0), (100, 0), "False", "ReplicasGiveSplit", "desired v1=100,v2=0, 2 pods give v1=100,v2=0"),
    ],
)
def test_service_mode_says_when_whole_pods_cannot_give_the_split_and_by_how_much(
    make_body: Body, replicas: tuple[int, int], traffic: tuple[int, int], status: str, reason: str, message: str
) -> None:
    condition = split_approximation(_model(make_body, replicas, traffic), Mode.SERVICE)
    assert (condition.type, condition.status, condition.reason) == ("SplitApproximated", status, reason)
    assert condition.message.startswith(message)


def test_gateway_mode_splits_per_request_and_is_never_approximated(make_body: Body) -> None:
    condition = split_approximation(_model(make_body, (3, 1), (90, 10)), Mode.GATEWAY)
    assert (condition.status, condition.reason) == ("False", "PerRequestSplit")
