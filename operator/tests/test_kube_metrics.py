"""kube.scrape_targets against real HTTP servers on loopback: the real runtime's metrics server (sums per version,
a real-sized page read to the same counters the RPCs made) and hostile replies - a gzip bomb, a page past the cap
with and without a Content-Length, a redirect to another server, a page that is not metrics, a slow trickle, an
error page, a counter of 1e999 - each refused with the operator's own words, in bounded memory and time, never
reaching the other server and never raising."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gzip
import socket
import struct
import time
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import grpc
import pytest
from aiohttp import web
from kubernetes_asyncio import client
from prometheus_client import generate_latest, start_http_server

from skiff_operator.kube import DeadlineApiClient, Kube, scrape_targets
from skiff_operator.prometheus import parse_exposition
from skiff_operator.scrape import MAX_PAGE_BYTES, SCRAPE_TIMEOUT_S
from skiff_operator.spec import parse_inference_model
from skiff_runtime.metrics import RuntimeMetrics
from tests.conftest import stored_body

INFER = "/inference.GRPCInferenceService/ModelInfer"
PREDICT = "/tensorflow.serving.PredictionService/Predict"
SAMPLE = b'grpc_server_handled_total{grpc_service="inference.GRPCInferenceService",grpc_method="ModelInfer",grpc_code="OK"} 1.0\n'  # noqa: E501
MiB = 1 << 20

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Serve = Callable[..., Awaitable[int]]


@pytest.fixture
def runtime_metrics() -> Iterator[tuple[RuntimeMetrics, int]]:
    """The runtime's metrics registry served on a free loopback port, as the pod serves it on 8003."""
    metrics = RuntimeMetrics("demo", "v1")
    server, thread = start_http_server(0, addr="127.0.0.1", registry=metrics.registry)
    yield metrics, int(server.server_port)
    server.shutdown()
    thread.join(timeout=5)


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Starts real aiohttp servers on loopback, each answering every path with `handler`; returns its port."""
    runners: list[web.AppRunner] = []

    async def start(handler: Handler, host: str = "127.0.0.1", port: int = 0) -> int:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        runners.append(runner)
        return int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]

    yield start
    for runner in runners:
        await runner.cleanup()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def gzip_bomb(inflated_mib: int) -> bytes:
    """A valid gzip stream of `inflated_mib` MiB of zeros, about 1,000 times smaller: one 1 MiB block compressed
    once (a full flush makes it position-independent) and repeated."""
    zeros = bytes(MiB)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(inflated_mib):
        crc = zlib.crc32(zeros, crc)
    trailer = struct.pack("<II", crc, (inflated_mib * MiB) & 0xFFFFFFFF)
    return b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + block * inflated_mib + deflate.flush() + trailer


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return gzip_bomb(2048)  # 2 GiB of zeros in about 2 MiB


def test_the_bomb_is_a_real_gzip_stream(bomb: bytes) -> None:
    assert gzip.decompress(gzip_bomb(3)) == bytes(3 * MiB)
    assert len(bomb) < 2 * 2048 * 1024  # 2 GiB inflated from about 2 MiB


async def scrape_one(port: int, **options: float) -> str:
    """The one pod's problem (empty when its page was read)."""
    scrape = await scrape_targets([("v1", "p1", "127.0.0.1")], port, ["v1"], **options)
    return scrape.problems.get("v1", "")


def said(port: int, words: str) -> str:
    """What status and Events carry for pod p1: the pod, its address, the operator's words; nothing else."""
    return f"pod p1 (127.0.0.1:{port}): {words}"


# -- the real runtime -----------------------------------------------------------------------------------------------


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


async def test_the_fullest_page_the_runtime_exports_reads_to_the_counters_its_rpcs_made(
    runtime_metrics: tuple[RuntimeMetrics, int],
) -> None:
    # Every method x every gRPC code, as scrape.MAX_PAGE_BYTES was measured: about 150 KB, served by the runtime's
    # own metrics server (which would gzip it for a client that accepts gzip; the scrape asks for identity).
    metrics, port = runtime_metrics
    methods = [INFER, PREDICT, "/inference.GRPCInferenceService/ModelMetadata", "/grpc.health.v1.Health/Check"]
    methods += [f"/inference.GRPCInferenceService/Method{n}" for n in range(10)]
    for method in methods:
        for code in grpc.StatusCode:
            metrics.observe_rpc(method, code.name, 0.003)
    metrics.observe_rpc(INFER, "OK", 0.4)
    page = generate_latest(metrics.registry)
    assert 100_000 < len(page) < MAX_PAGE_BYTES
    scrape = await scrape_targets([("v1", "p1", "127.0.0.1")], port, ["v1"])
    assert scrape.problems == {}
    expected_codes = {code.name: 2 for code in grpc.StatusCode} | {"OK": 3}  # ModelInfer and Predict only
    assert scrape.counts["v1"].codes == expected_codes
    assert scrape.counts["v1"].buckets["+Inf"] == 2 * len(grpc.StatusCode) + 1
    assert scrape.counts["v1"].buckets["0.005"] == 2 * len(grpc.StatusCode)
    # Streamed or whole: the same counters (but the CPU time, which grew between the two pages).
    streamed, whole = scrape.counts["v1"], parse_exposition(page.decode())
    assert dataclasses.replace(streamed, cpu_seconds=0.0) == dataclasses.replace(whole, cpu_seconds=0.0)
    assert streamed.cpu_seconds >= whole.cpu_seconds > 0


async def test_an_unreachable_pod_makes_its_version_unreadable() -> None:
    closed = free_port()
    scrape = await scrape_targets([("v1", "p1", "127.0.0.1")], closed, ["v1"])
    assert scrape.problems["v1"] == said(closed, "connection failed")
    counts, problem = scrape.side(["v1"])
    assert counts is None
    assert problem == f"v1: {said(closed, 'connection failed')}"


# -- hostile replies --------------------------------------------------------------------------------------------------


async def test_a_gzip_bomb_is_refused_unopened_in_bounded_memory(serve: Serve, bomb: bytes) -> None:
    async def compressed(request: web.Request) -> web.StreamResponse:
        # Written in slices, so that the server's own copies do not count against the scrape's memory.
        response = web.StreamResponse(headers={"Content-Encoding": "gzip", "Content-Type": "text/plain"})
        response.content_length = len(bomb)
        await response.prepare(request)
        with contextlib.suppress(ConnectionError, RuntimeError):  # the client hung up
            for start in range(0, len(bomb), 64 * 1024):
                await response.write(bomb[start : start + 64 * 1024])
        return response

    port = await serve(compressed)
    tracemalloc.start()
    try:
        problem = await scrape_one(port)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert problem == said(port, "compressed reply refused")
    assert peak < 1 * MiB, f"the bomb cost {peak / MiB:.1f} MiB"


async def test_a_page_without_a_length_is_cut_off_at_the_cap_in_bounded_memory(serve: Serve) -> None:
    written = 0

    async def endless(request: web.Request) -> web.StreamResponse:  # valid samples, chunked, forever
        nonlocal written
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        chunk = SAMPLE * 512
        with contextlib.suppress(ConnectionError, RuntimeError):  # the client hung up
            while written < 256 * MiB:
                await response.write(chunk)
                written += len(chunk)
        return response

    port = await serve(endless)
    tracemalloc.start()
    try:
        problem = await scrape_one(port)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert problem == said(port, f"metrics page over {MAX_PAGE_BYTES} bytes")
    assert peak < 2 * MiB, f"the endless page cost {peak / MiB:.1f} MiB"
    await asyncio.sleep(0.2)
    assert written < 64 * MiB  # the scrape stopped reading: the server could not push the page on


async def test_a_content_length_over_the_cap_is_refused_before_the_body(serve: Serve) -> None:
    async def announced(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        response.content_length = MAX_PAGE_BYTES + 1
        await response.prepare(request)
        await response.write(SAMPLE)
        await asyncio.sleep(30)  # the rest never comes: only the header can have refused it in time
        return response

    port = await serve(announced)
    started = time.monotonic()
    assert await scrape_one(port) == said(port, f"metrics page over {MAX_PAGE_BYTES} bytes")
    assert time.monotonic() - started < 1.0 < SCRAPE_TIMEOUT_S


async def test_a_content_length_within_the_cap_is_read(serve: Serve) -> None:
    async def page(_: web.Request) -> web.Response:
        return web.Response(body=SAMPLE * 3, content_type="text/plain")

    assert (await scrape_targets([("v1", "p1", "127.0.0.1")], await serve(page), ["v1"])).counts["v1"].codes == {
        "OK": 3
    }


@pytest.mark.parametrize("status", [301, 302, 307, 308])
async def test_a_redirect_is_refused_and_its_target_never_asked(serve: Serve, status: int) -> None:
    hits: list[str] = []

    async def elsewhere(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(body=SAMPLE, content_type="text/plain")

    other = await serve(elsewhere)
    location = f"http://127.0.0.1:{other}/api/v1/secrets?token=steal"

    async def redirect(_: web.Request) -> web.Response:
        return web.Response(status=status, headers={"Location": location}, text=f"moved to {location}")

    port = await serve(redirect)
    problem = await scrape_one(port)
    assert problem == said(port, "redirect refused")
    assert str(other) not in problem
    assert hits == []
    # The other server answers when asked directly (it is not just unreachable).
    assert (await scrape_targets([("v1", "p1", "127.0.0.1")], other, ["v1"])).counts["v1"].codes == {"OK": 1}
    assert hits == ["/metrics"]


@pytest.mark.parametrize(
    "body",
    [
        b"<html><script>steal()</script>login</html>",
        b'grpc_server_handled_total{grpc_method="ModelInfer",grpc_code="OK"} 1e999\n',  # inf: OverflowError once
        b'grpc_server_handled_total{grpc_method="ModelInfer",grpc_code="OK"} NaN\n',
        b"\xff\xfe\x00binary\n",
    ],
)
async def test_a_page_that_is_not_metrics_is_refused_without_its_content(serve: Serve, body: bytes) -> None:
    async def page(_: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/plain")

    port = await serve(page)
    assert await scrape_one(port) == said(port, "not Prometheus text")


async def test_a_line_past_the_line_cap_is_refused(serve: Serve) -> None:
    async def page(_: web.Request) -> web.Response:
        return web.Response(body=b"# " + b"x" * 100_000 + b"\n", content_type="text/plain")

    port = await serve(page)
    assert await scrape_one(port) == said(port, "metrics line over 4096 bytes")


async def test_an_error_page_says_only_its_status(serve: Serve) -> None:
    async def failing(_: web.Request) -> web.Response:
        return web.Response(status=500, text="internal error: see http://evil.example/ for details")

    port = await serve(failing)
    assert await scrape_one(port) == said(port, "HTTP 500")


async def test_a_slow_trickle_times_out_and_a_slow_page_within_the_deadline_is_read(serve: Serve) -> None:
    async def trickle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        for _ in range(10):  # ten lines a second
            await response.write(SAMPLE)
            await asyncio.sleep(0.1)
        return response

    port = await serve(trickle)
    started = time.monotonic()
    assert await scrape_one(port, timeout_s=0.5) == said(port, "timed out")
    assert time.monotonic() - started < 1.0
    scrape = await scrape_targets([("v1", "p1", "127.0.0.1")], port, ["v1"], timeout_s=3.0)
    assert scrape.counts["v1"].codes == {"OK": 10}


async def test_one_pods_failure_is_its_own_and_the_other_pods_are_still_read(
    serve: Serve, runtime_metrics: tuple[RuntimeMetrics, int]
) -> None:
    # Three "pods" on one port at three loopback addresses, read in one scrape: the real runtime (v2), one whose
    # counter overflows (round(1e999) raised OverflowError through the reconcile once), one that hangs up mid-reply.
    metrics, port = runtime_metrics
    metrics.observe_rpc(INFER, "OK", 0.001)

    async def overflowing(_: web.Request) -> web.Response:
        return web.Response(body=SAMPLE.replace(b"1.0", b"1e999"), content_type="text/plain")

    async def broken(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        response.content_length = 10_000
        await response.prepare(request)
        await response.write(SAMPLE)
        assert request.transport is not None
        request.transport.abort()
        return response

    await serve(overflowing, "127.0.0.2", port)
    await serve(broken, "127.0.0.3", port)
    targets = [("v1", "p1", "127.0.0.2"), ("v2", "p2", "127.0.0.1"), ("v3", "p3", "127.0.0.3")]
    scrape = await scrape_targets(targets, port, ["v1", "v2", "v3"])
    assert scrape.problems == {
        "v1": f"pod p1 (127.0.0.2:{port}): not Prometheus text",
        "v3": f"pod p3 (127.0.0.3:{port}): reply broken off",
    }
    assert scrape.counts["v2"].codes == {"OK": 1}


async def test_kube_reads_the_pod_whose_owner_chain_reaches_the_deployment_uid_and_not_the_look_alike(
    serve: Serve, runtime_metrics: tuple[RuntimeMetrics, int]
) -> None:
    """Against a small HTTP server as the API server: the model's Deployments, ReplicaSets and Pods are listed
    (label-selected); of two pods labelled as v1 under ReplicaSets named demo-v1-*, only the one whose ReplicaSet
    the version's Deployment controls is read - the look-alike's fake counters never arrive, it is never asked."""
    metrics, port = runtime_metrics
    metrics.observe_rpc(INFER, "OK", 0.001)
    look_alike_hits: list[str] = []

    async def fake_counters(request: web.Request) -> web.Response:
        look_alike_hits.append(request.path)
        return web.Response(body=SAMPLE.replace(b"1.0", b"1000000"), content_type="text/plain")

    await serve(fake_counters, "127.0.0.2", port)

    def owner(kind: str, name: str, uid: str) -> list[dict[str, object]]:
        return [{"apiVersion": "v1", "kind": kind, "name": name, "uid": uid, "controller": True}]

    def running_pod(name: str, ip: str, rs: str, rs_uid: str) -> dict[str, object]:
        metadata = {"name": name, "labels": {"skiff.dev/model": "demo", "skiff.dev/version": "v1"},
                    "ownerReferences": owner("ReplicaSet", rs, rs_uid)}  # fmt: skip
        status = {"phase": "Running", "podIP": ip, "containerStatuses": [{"name": "runtime", "started": True}]}
        return {"metadata": metadata, "status": status}

    labels = {"skiff.dev/model": "demo", "skiff.dev/version": "v1"}
    lists = {
        "/apis/apps/v1/namespaces/ml/deployments": [
            {
                "metadata": {
                    "name": "demo-v1",
                    "uid": "dep-1",
                    "labels": labels,
                    "ownerReferences": owner("InferenceModel", "demo", "uid-1"),
                }
            },
        ],
        "/apis/apps/v1/namespaces/ml/replicasets": [
            {
                "metadata": {
                    "name": "demo-v1-5d8f7",
                    "uid": "rs-1",
                    "labels": labels,
                    "ownerReferences": owner("Deployment", "demo-v1", "dep-1"),
                }
            },
            {
                "metadata": {
                    "name": "demo-v1-x",
                    "uid": "rs-x",
                    "labels": labels,
                    "ownerReferences": owner("Deployment", "demo-v1", "dep-someone-elses"),
                }
            },
        ],
        "/api/v1/namespaces/ml/pods": [
            running_pod("demo-v1-5d8f7-aaaaa", "127.0.0.1", "demo-v1-5d8f7", "rs-1"),
            running_pod("demo-v1-x-bbbbb", "127.0.0.2", "demo-v1-x", "rs-x"),
        ],
    }
    asked: list[tuple[str, str]] = []

    async def api(request: web.Request) -> web.Response:
        asked.append((request.path, request.query.get("labelSelector", "")))
        return web.json_response({"kind": "List", "apiVersion": "v1", "metadata": {}, "items": lists[request.path]})

    api_port = await serve(api)
    body = {"apiVersion": "skiff.dev/v1alpha1", "kind": "InferenceModel",
            "metadata": {"name": "demo", "namespace": "ml", "uid": "uid-1", "generation": 1},
            "spec": {"versions": [{"name": "v1", "modelUri": "pvc://models/a"}]}}  # fmt: skip
    model = parse_inference_model(stored_body(body))
    async with DeadlineApiClient(client.Configuration(host=f"http://127.0.0.1:{api_port}")) as api_client:
        kube = Kube(api_client)
        kube.metrics_port = port
        scrape = await kube.scrape_metrics(model, ["v1"])
    assert scrape.problems == {}
    assert scrape.counts["v1"].codes == {"OK": 1}
    assert look_alike_hits == []
    assert sorted(asked) == sorted((path, "skiff.dev/model=demo") for path in lists)
