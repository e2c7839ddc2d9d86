"""The real probe server (server.health.ProbeServer) on loopback: held calls, per-peer caps, Watch and sizes."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from runtime.tests.server.held_calls import Connection

from skiff_runtime.server.health import (
    MAX_WATCH_STREAMS,
    NOT_SERVING,
    PROBE_CALLS_PER_PEER,
    PROBE_RECEIVE_TIMEOUT_S,
    SERVING,
    ProbeServer,
)

pytestmark = [pytest.mark.server, pytest.mark.timeout(60)]

CHECK = "/grpc.health.v1.Health/Check"


@pytest.fixture
def probes() -> Iterator[tuple[ProbeServer, str]]:
    """A probe server on 127.0.0.1 with "" and "m" SERVING; yields it and its target."""
    server = ProbeServer()
    for service in ("", "m"):
        asyncio.run(server.set(service, SERVING))
    port = server.start("127.0.0.1:0")
    yield server, f"127.0.0.1:{port}"
    server.stop()


def _check(target: str, service: str = "m", timeout: float = 1) -> tuple[int, float]:
    """A fresh Check from 127.0.0.1 on a new connection, as kubelet sends it: (status, seconds taken)."""
    options = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own, not a shared one
    with grpc.insecure_channel(target, options=options) as channel:
        started = time.monotonic()
        response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                             timeout=timeout)  # fmt: skip
        return response.status, time.monotonic() - started


def _wait(condition: object, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline
        time.sleep(0.02)


def _silent(release: threading.Event) -> Iterator[bytes]:
    """A request iterator that yields nothing until released: the call sends its headers and no message."""
    release.wait(30)
    return
    yield


@pytest.mark.parametrize("held", [8, 64])
def test_held_header_only_calls_leave_a_fresh_check_serving_within_1s_and_end_at_the_deadline(
    probes: tuple[ProbeServer, str], held: int
) -> None:
    """`held` calls that send headers and never a message, from as many peers as the per-peer cap needs (8 from
    one address on main filled the probe server: the next Check was RESOURCE_EXHAUSTED in 3 ms)."""
    _, target = probes
    peers = [Connection(target, f"127.0.0.{2 + n}") for n in range(held // PROBE_CALLS_PER_PEER)]
    try:
        streams = [peer.open() for peer in peers for _ in range(PROBE_CALLS_PER_PEER)]
        time.sleep(0.2)  # every call's headers are in
        status, took = _check(target)
        assert (status, took < 1) == (SERVING, True), took
        _wait(lambda: all(s.ended is not None for s in streams), PROBE_RECEIVE_TIMEOUT_S + 3)
        lived = [s.ended - s.opened for s in streams if s.ended is not None]
        assert min(lived) >= PROBE_RECEIVE_TIMEOUT_S - 0.1, lived  # each was held to the deadline, not refused
        assert max(lived) < PROBE_RECEIVE_TIMEOUT_S + 2, lived
        assert all(s.data == b"" for s in streams)  # ended with a status, no answer
        assert _check(target)[0] == SERVING
    finally:
        for peer in peers:
            peer.close()


def test_a_peer_past_its_cap_is_refused_while_another_peer_and_later_the_same_peer_are_served(
    probes: tuple[ProbeServer, str],
) -> None:
    _, target = probes
    release = threading.Event()
    with grpc.insecure_channel(target) as channel:
        silent = channel.stream_unary(CHECK, request_serializer=None, response_deserializer=None)
        held = [silent.future(_silent(release), timeout=20) for _ in range(PROBE_CALLS_PER_PEER)]
        time.sleep(0.2)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as refused:
            _check(target)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"{PROBE_CALLS_PER_PEER} calls from 127.0.0.1 are open" in (refused.value.details() or "")
        assert time.monotonic() - started < 0.5  # refused at once, not queued
        other = Connection(target, "127.0.0.2")  # another address is served meanwhile
        try:
            check = other.check("m")
            _wait(lambda: check.ended is not None, 1)
            assert check.check_status() == SERVING
        finally:
            other.close()
        for call in held:  # the server ends each held call at the receive deadline
            with pytest.raises(grpc.RpcError) as ended:
                call.result(timeout=PROBE_RECEIVE_TIMEOUT_S + 3)
            assert ended.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert f"did not arrive within {PROBE_RECEIVE_TIMEOUT_S:g} s" in (ended.value.details() or "")
        assert time.monotonic() - started < PROBE_RECEIVE_TIMEOUT_S + 2
        assert _check(target)[0] == SERVING  # the same address again, once its calls ended
    release.set()


def test_watch_follows_status_set_from_another_loop_and_streams_past_the_cap_are_refused(
    probes: tuple[ProbeServer, str],
) -> None:
    server, target = probes
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service="m")
        streams = [stub.Watch(request, timeout=20) for _ in range(MAX_WATCH_STREAMS)]
        assert [next(s).status for s in streams] == [SERVING] * MAX_WATCH_STREAMS
        with pytest.raises(grpc.RpcError) as refused:
            next(stub.Watch(request, timeout=5))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "poll with Check" in (refused.value.details() or "")
        streams[0].cancel()  # one watcher of "m" ends; the others still hear every change
        time.sleep(0.2)
        asyncio.run(server.set("m", NOT_SERVING))  # from this thread's own event loop, as the runtime does
        assert [next(s).status for s in streams[1:]] == [NOT_SERVING] * (MAX_WATCH_STREAMS - 1)
        assert stub.Check(request, timeout=5).status == NOT_SERVING
        for stream in streams:
            stream.cancel()


def test_a_message_over_the_probe_limit_is_refused_and_an_unknown_service_is_not_found(
    probes: tuple[ProbeServer, str],
) -> None:
    _, target = probes
    with grpc.insecure_channel(target) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        with pytest.raises(grpc.RpcError) as big:
            check(health_pb2.HealthCheckRequest(service="m" * 2000), timeout=5)
        assert big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(grpc.RpcError) as unknown:
            check(health_pb2.HealthCheckRequest(service="another-model"), timeout=5)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        assert check(health_pb2.HealthCheckRequest(service="m"), timeout=5).status == SERVING
