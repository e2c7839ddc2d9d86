"""kube.scrape_targets and metrics_targets: which pods are read (the model's own, running and started), and reading
the real runtime's metrics server on loopback (sums per version; an unreachable pod or a page that is not metrics
makes its version unreadable)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import start_http_server

from skiff_operator.kube import metrics_targets, scrape_targets
from skiff_runtime.metrics import RuntimeMetrics

INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture
def runtime_metrics() -> Iterator[tuple[RuntimeMetrics, int]]:
    """The runtime's metrics registry served on a free loopback port, as the pod serves it on 8003."""
    metrics = RuntimeMetrics("demo", "v1")
    server, thread = start_http_server(0, addr="127.0.0.1", registry=metrics.registry)
    yield metrics, int(server.server_port)
    server.shutdown()
    thread.join(timeout=5)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def pod(name: str, version: str, owner: str | None = None, **status: Any) -> dict[str, Any]:
    replica_set = {"kind": "ReplicaSet", "name": owner or f"demo-{version}-5d8f7", "controller": True}
    return {
        "metadata": {"name": name, "labels": {"skiff.dev/version": version}, "ownerReferences": [replica_set]},
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.1",
            "containerStatuses": [{"name": "runtime", "started": True}],
            **status,
        },
    }


def test_only_started_running_pods_of_the_versions_replica_sets_with_an_ip_are_read() -> None:
    deleting = pod("d", "v1")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    bare = pod("bare", "v1")
    del bare["metadata"]["ownerReferences"]
    pods = [
        pod("b", "v2", podIP="fd00::2"),
        pod("a", "v1"),
        pod("pending", "v1", phase="Pending"),
        pod("no-ip", "v1", podIP=None),
        pod("starting", "v1", containerStatuses=[{"name": "runtime", "started": False}]),
        pod("no-status-yet", "v1", containerStatuses=None),
        pod("other", "v9"),
        pod("impostor", "v1", owner="someone-elses-7f9c"),
        deleting,
        bare,
    ]
    wanted = {"v1": "v1", "v2": "v2"}
    deployments = {"v1": "demo-v1", "v2": "demo-v2"}
    assert metrics_targets(pods, wanted, deployments) == [("v1", "a", "10.0.0.1"), ("v2", "b", "fd00::2")]


async def test_counters_of_each_pod_are_summed_per_version(runtime_metrics: tuple[RuntimeMetrics, int]) -> None:
    metrics, port = runtime_metrics
    for code in ("OK", "OK", "UNAVAILABLE"):
        metrics.observe_rpc(INFER, code, 0.004)
    # The same server twice stands for two pods of v1; v2 has no running pod yet.
    scrape = await scrape_targets([("v1", "p1", "127.0.0.1"), ("v1", "p2", "127.0.0.1")], port, ["v1", "v2"])
    assert scrape.problems == {}
    assert scrape.counts["v1"].codes == {"OK": 4, "UNAVAILABLE": 2}
    assert scrape.counts["v2"].requests == 0
    both, problem = scrape.side(["v1", "v2"])
    assert both is not None
    assert (both.requests, problem) == (6, "")


async def test_an_unreachable_pod_makes_its_version_unreadable() -> None:
    closed = free_port()
    scrape = await scrape_targets([("v1", "p1", "127.0.0.1")], closed, ["v1"])
    assert "pod p1 (127.0.0.1:" in scrape.problems["v1"]
    counts, problem = scrape.side(["v1"])
    assert counts is None
    assert problem.startswith("v1: pod p1")


async def test_a_page_that_is_not_metrics_is_reported(unused_tcp_port: int) -> None:
    async def login_page(_: web.Request) -> web.Response:
        return web.Response(text="<html>login</html>")

    app = web.Application()
    app.router.add_get("/metrics", login_page)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", unused_tcp_port).start()
    try:
        scrape = await scrape_targets([("v1", "p1", "127.0.0.1")], unused_tcp_port, ["v1"])
    finally:
        await runner.cleanup()
    assert "not a Prometheus sample" in scrape.problems["v1"]
