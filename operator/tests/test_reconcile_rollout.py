"""reconcile with spec.rollout: the GRPCRoute follows the rollout's steps while spec.traffic stays as written;
status.rollout, the RolledBack condition and the Events tell why; removing the rollout clears its status."""

from __future__ import annotations

import copy
import datetime
from collections.abc import Callable
from typing import Any

from skiff_operator.contract import METRICS_PORT
from skiff_operator.observed import MetricsScrape
from skiff_operator.prometheus import Counts
from skiff_operator.reconcile import reconcile
from tests.conftest import wire
from tests.fakes import GATEWAYS, FakeCluster, canary_body, condition, deployment

T0 = datetime.datetime(2026, 5, 1, 12, 0, tzinfo=datetime.UTC)
Body = Callable[..., dict[str, Any]]
ROLLOUT = {
    "candidate": "v2",
    "steps": [{"weight": 10, "pause": "1m"}, {"weight": 50, "pause": "1m"}],
    "analysis": {"minRequests": 100},
}


def ok(requests: int, errors: int = 0) -> Counts:
    total = requests + errors
    return Counts({"OK": requests, "INTERNAL": errors}, {"0.01": total, "+Inf": total})


async def step(body: dict[str, Any], cluster: FakeCluster, seconds: float, v1: Counts, v2: Counts) -> Any:
    cluster.metrics = MetricsScrape({"v1": v1, "v2": v2})
    outcome = await reconcile(body, cluster, T0 + datetime.timedelta(seconds=seconds))
    body["status"] = wire(outcome.status)
    return outcome


def weights(cluster: FakeCluster) -> dict[str, int]:
    route = cluster.objects[("GRPCRoute", "fraud")]
    return {b["name"]: b["weight"] for b in route["spec"]["rules"][0]["backendRefs"]}


async def started(make_body: Body) -> tuple[dict[str, Any], FakeCluster, Any]:
    """A model with v1 and v2 ready, Gateway mode, and a rollout of v2 that has just started."""
    cluster = FakeCluster()
    cluster.gateway_api = True
    cluster.deployment_states.update(v1=deployment(3), v2=deployment(1))
    body = canary_body(make_body, 100, 0, routing={"gateways": GATEWAYS}, rollout=ROLLOUT)
    first = await step(body, cluster, 0, ok(0), ok(0))
    return body, cluster, first


async def test_a_good_candidate_is_promoted_and_spec_traffic_is_untouched(make_body: Body) -> None:
    body, cluster, first = await started(make_body)
    spec_before = copy.deepcopy(body["spec"])
    assert weights(cluster) == {"fraud-v1": 90, "fraud-v2": 10}
    assert body["status"]["rollout"]["summary"] == "1/2 Progressing"
    assert condition(body["status"], "RolledBack") == ("False", "InStep")
    assert ("Normal", "RolloutStarted") in [(e.type, e.reason) for e in first.events]

    await step(body, cluster, 61, ok(5000), ok(200))
    assert weights(cluster) == {"fraud-v1": 50, "fraud-v2": 50}
    last = await step(body, cluster, 122, ok(6000), ok(400))
    assert weights(cluster) == {"fraud-v1": 0, "fraud-v2": 100}
    assert body["status"]["rollout"]["verdict"] == "Promoted"
    assert body["status"]["trafficSplit"] == "v1=0,v2=100"
    assert "RolloutPromoted" in [e.reason for e in last.events]
    assert body["spec"] == spec_before


async def test_a_failing_candidate_is_rolled_back_with_the_numbers(make_body: Body) -> None:
    body, cluster, _ = await started(make_body)
    outcome = await step(body, cluster, 20, ok(900), ok(60, errors=60))
    assert weights(cluster) == {"fraud-v1": 100, "fraud-v2": 0}
    assert condition(wire(outcome.status), "RolledBack") == ("True", "ErrorRatioExceeded")
    message = next(c["message"] for c in wire(outcome.status)["conditions"] if c["type"] == "RolledBack")
    assert "error ratio 0.5000 > maxErrorRatio 0.01" in message
    assert ("Warning", "RolloutErrorRatioExceeded") in [(e.type, e.reason) for e in outcome.events]
    assert wire(outcome.status)["rollout"]["analysis"][0]["errors"] == 60


async def test_unreadable_metrics_wait_at_the_current_share(make_body: Body) -> None:
    body, cluster, _ = await started(make_body)
    cluster.metrics = MetricsScrape({"v1": ok(10)}, {"v2": "pod fraud-v2-x (10.0.0.7:8003): connection failed"})
    outcome = await reconcile(body, cluster, T0 + datetime.timedelta(seconds=90))
    assert wire(outcome.status)["rollout"]["verdict"] == "Waiting"
    assert "10.0.0.7:8003): connection failed" in wire(outcome.status)["rollout"]["message"]
    assert weights(cluster) == {"fraud-v1": 90, "fraud-v2": 10}


async def test_removing_the_rollout_clears_its_status(make_body: Body) -> None:
    body, cluster, _ = await started(make_body)
    del body["spec"]["rollout"]
    outcome = await step(body, cluster, 10, ok(0), ok(0))
    assert wire(outcome.status)["rollout"] is None
    assert "RolledBack" not in {c["type"] for c in wire(outcome.status)["conditions"]}
    assert weights(cluster) == {"fraud-v1": 100, "fraud-v2": 0}


async def test_a_model_without_a_rollout_reads_no_metrics(make_body: Body) -> None:
    cluster = FakeCluster()
    cluster.metrics = None  # type: ignore[assignment]  # reading it would fail the reconcile
    outcome = await reconcile(make_body(), cluster, T0)
    assert "rollout" not in wire(outcome.status)


def metrics_peers(cluster: FakeCluster) -> list[str]:
    policy = cluster.objects[("NetworkPolicy", "fraud")]
    rule = next(r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == METRICS_PORT)
    return list(rule["from"][0]["namespaceSelector"]["matchExpressions"][0]["values"])


async def test_the_operators_namespace_may_scrape_the_pods_of_a_model_with_a_rollout(make_body: Body) -> None:
    cluster = FakeCluster()
    cluster.operator_namespace = "skiff-system"
    cluster.deployment_states.update(v1=deployment(3), v2=deployment(1))
    body = canary_body(make_body, 100, 0, rollout=ROLLOUT, networkPolicy={"metricsNamespaces": []})
    await step(body, cluster, 0, ok(0), ok(0))
    assert metrics_peers(cluster) == ["skiff-system"]
    del body["spec"]["rollout"]
    body["spec"]["networkPolicy"] = {}
    await step(body, cluster, 10, ok(0), ok(0))
    assert metrics_peers(cluster) == ["monitoring"]  # without a rollout, only the monitoring namespaces
