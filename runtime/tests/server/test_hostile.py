"""Hostile messages against a live runtime, built byte by byte (bench/hostile.py): each answered in bounded time
and memory while health keeps answering; calls that never send their message and Watch floods stay bounded."""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest
from bench.hostile import HOSTILE, good_request, measure
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from runtime.tests.server.held_calls import Connection

from skiff_runtime.client import SkiffClient
from skiff_runtime.proto import inference_pb2 as pb
from skiff_runtime.proto import inference_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.paddle, pytest.mark.server]

MESSAGE_BYTES = 8 << 20
# Generous bounds for a loaded 2-core CI machine; `python -m bench.hostile` measures the real figures
# (docs/reliability.md): ~10 ms per message, health p99 ~2 ms. Before the bounded scan: up to 9 s per 4 MiB
# message with health Checks timing out throughout.
MAX_SECONDS = 5.0
MAX_HEALTH_MS = 1000.0


@pytest.mark.parametrize("name", list(HOSTILE), ids=str)
def test_hostile_message_is_refused_in_bounded_time_and_memory_while_health_answers(two_io_server, name) -> None:
    message = HOSTILE[name](MESSAGE_BYTES)
    outcome = measure(two_io_server.target, two_io_server.health_target, two_io_server.proc.pid, message)
    print(f"{name}: {outcome.code} in {outcome.seconds:.3f} s, RSS +{outcome.rss_growth_mib:.0f} MiB, "
          f"health max {max(outcome.health_ms, default=0):.1f} ms")  # fmt: skip
    assert outcome.code == "INVALID_ARGUMENT", outcome.details
    assert len(outcome.details) < 400
    assert outcome.seconds < MAX_SECONDS
    assert outcome.rss_growth_mib < 4 * len(message) / 2**20 + 32
    assert outcome.health_failures == 0
    assert outcome.health_ms
    assert max(outcome.health_ms) < MAX_HEALTH_MS
    assert two_io_server.proc.poll() is None
    good = measure(two_io_server.target, two_io_server.health_target, two_io_server.proc.pid, good_request(2))
    assert good.code == "OK"


def _silent(release: threading.Event) -> object:
    """A request iterator that yields nothing until released: the call sends its headers and no message."""
    release.wait(30)
    return
    yield


def test_calls_without_a_message_time_out_and_watch_streams_are_capped(runtime_factory, model_dirs) -> None:
    runtime = runtime_factory(model_dirs["conv"], "conv", "--workers", "1", "--receive-timeout-s", "1")
    runtime.wait_serving()
    release = threading.Event()
    with grpc.insecure_channel(runtime.target) as channel:
        for method in ("/inference.GRPCInferenceService/ServerLive", "/grpc.health.v1.Health/Check"):
            silent = channel.stream_unary(method, request_serializer=None, response_deserializer=None)
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as caught:
                silent(_silent(release), timeout=20)
            assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, caught.value.details()
            assert "did not arrive within 1 s" in caught.value.details()
            assert time.monotonic() - started < 10
        for target in (runtime.target, runtime.health_target):
            with grpc.insecure_channel(target) as watch_channel:
                stub = health_pb2_grpc.HealthStub(watch_channel)
                request = health_pb2.HealthCheckRequest(service="conv")
                streams = [stub.Watch(request, timeout=30) for _ in range(4)]
                for stream in streams:
                    assert next(stream).status == health_pb2.HealthCheckResponse.SERVING
                with pytest.raises(grpc.RpcError) as refused:
                    next(stub.Watch(request, timeout=10))
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "poll with Check" in refused.value.details()
                assert stub.Check(request, timeout=5).status == health_pb2.HealthCheckResponse.SERVING
                for stream in streams:
                    stream.cancel()
        with SkiffClient(runtime.target) as client:  # inference unaffected throughout
            assert client.infer("conv", {"image": np.ones((1, 3, 32, 32), np.float32)})["fetch_name_0"].shape == (1, 10)
    release.set()
    assert runtime.terminate() == 0


def test_health_answers_while_a_flood_of_hostile_messages_arrives(two_io_server) -> None:
    """Four clients send the costliest messages back to back; health on the probe port keeps answering."""
    stop = threading.Event()
    codes: dict[str, int] = {}
    lock = threading.Lock()
    messages = [HOSTILE[n](2 << 20) for n in ("raw_input_contents: empty fields", "parameters: tiny entries")]

    def flood() -> None:
        options = [("grpc.max_send_message_length", -1)]
        with grpc.insecure_channel(two_io_server.target, options=options) as channel:
            call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            while not stop.is_set():
                for message in messages:
                    try:
                        call(message, timeout=10)
                        code = "OK"
                    except grpc.RpcError as exc:
                        code = exc.code().name
                    with lock:
                        codes[code] = codes.get(code, 0) + 1

    threads = [threading.Thread(target=flood) for _ in range(4)]
    for thread in threads:
        thread.start()
    latencies = []
    try:
        with grpc.insecure_channel(two_io_server.health_target) as channel:
            check = health_pb2_grpc.HealthStub(channel).Check
            request = health_pb2.HealthCheckRequest(service="two_io")
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                started = time.perf_counter()
                assert check(request, timeout=2).status == health_pb2.HealthCheckResponse.SERVING
                latencies.append(time.perf_counter() - started)
                time.sleep(0.01)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    p99_ms = 1000 * float(np.percentile(latencies, 99))
    print(f"flood: {codes}; health p99 {p99_ms:.1f} ms over {len(latencies)} checks")
    assert set(codes) == {"INVALID_ARGUMENT"}
    assert sum(codes.values()) > 20
    assert p99_ms < MAX_HEALTH_MS


def test_a_request_over_the_message_limit_is_refused_by_grpc(two_io_server) -> None:
    """Over --max-message-mb (32 MiB by default) gRPC refuses before Python sees a byte."""
    big = pb.ModelInferRequest(model_name="two_io", raw_input_contents=[bytes(33 << 20)])
    with grpc.insecure_channel(two_io_server.target, options=[("grpc.max_send_message_length", -1)]) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as caught:
            call(big.SerializeToString(), timeout=30)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_streams_past_the_per_connection_limit_wait_while_other_connections_and_health_answer(
    runtime_factory, model_dirs
) -> None:
    """--max-streams-per-connection 2: two calls that never send their message hold both streams of their
    connection; a third call on that connection waits (HTTP/2 MAX_CONCURRENT_STREAMS: the client queues it) until
    its deadline, while a new connection and the health port answer at once; once a stream is freed, a waiting call
    on the first connection runs."""
    runtime = runtime_factory(
        model_dirs["conv"], "conv", "--workers", "1", "--max-streams-per-connection", "2", "--receive-timeout-s", "30"
    )
    runtime.wait_serving()
    own_connection = [("grpc.use_local_subchannel_pool", 1)]  # channels to one target otherwise share a connection
    live = "/inference.GRPCInferenceService/ServerLive"
    release = threading.Event()
    with grpc.insecure_channel(runtime.target, options=own_connection) as crowded:
        live_on_crowded = crowded.unary_unary(live, request_serializer=None, response_deserializer=None)
        live_on_crowded(pb.ServerLiveRequest().SerializeToString(), timeout=10)  # connected; the limit is known
        silent = crowded.stream_unary("/inference.GRPCInferenceService/ModelInfer")
        holders = [silent.future(_silent(release), timeout=60) for _ in range(2)]
        time.sleep(1)  # both streams open on the server
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as waited:
            live_on_crowded(pb.ServerLiveRequest().SerializeToString(), timeout=2)
        assert waited.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - started >= 1.9
        with grpc.insecure_channel(runtime.target, options=own_connection) as other:  # the holders hold for 30 s
            other.unary_unary(live)(pb.ServerLiveRequest().SerializeToString(), timeout=5)
        with grpc.insecure_channel(runtime.health_target) as probe:
            check = health_pb2_grpc.HealthStub(probe).Check
            response = check(health_pb2.HealthCheckRequest(service="conv"), timeout=1)
            assert response.status == health_pb2.HealthCheckResponse.SERVING
        queued = live_on_crowded.future(pb.ServerLiveRequest().SerializeToString(), timeout=30)
        time.sleep(0.5)
        assert not queued.done()
        release.set()  # the holders end their streams without a message: INVALID_ARGUMENT, their streams freed
        assert pb.ServerLiveResponse.FromString(queued.result(timeout=30)).live
        for holder in holders:
            assert holder.exception(timeout=30).code() == grpc.StatusCode.INVALID_ARGUMENT
    assert runtime.terminate() == 0


@pytest.mark.parametrize("held", [8, 64])
def test_header_only_calls_on_the_probe_port_leave_a_fresh_probe_serving_within_1s(conv_server, held: int) -> None:
    """`held` raw HTTP/2 calls that send headers and never a message, 8 from each of held/8 addresses (on 727b5ea
    8 from one address filled the probe port: the next Check was RESOURCE_EXHAUSTED in 2.5 ms); the server ends
    every one of them at its receive deadline."""
    peers = [Connection(conv_server.health_target, f"127.0.0.{2 + n}") for n in range(held // 8)]
    try:
        streams = [peer.open() for peer in peers for _ in range(8)]
        time.sleep(0.3)  # every call's headers are in
        with grpc.insecure_channel(conv_server.health_target) as channel:
            started = time.monotonic()
            response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="conv"),
                                                                 timeout=1)  # fmt: skip
            assert response.status == health_pb2.HealthCheckResponse.SERVING
            assert time.monotonic() - started < 1
        deadline = time.monotonic() + 5
        while not all(s.ended is not None for s in streams):
            assert time.monotonic() < deadline, "the probe port did not end the held calls"
            time.sleep(0.05)
        lived = [s.ended - s.opened for s in streams if s.ended is not None]
        assert min(lived) >= 0.9, lived  # held to the probe port's 1 s receive deadline, not refused
    finally:
        for peer in peers:
            peer.close()


def test_small_methods_refuse_a_large_message_unparsed_and_answer_a_small_one(conv_server) -> None:
    """Health, reflection and the inference service's small methods on the inference port take a few bytes, not
    the port's 32 MiB: over their limit (1 KiB for health, 64 KiB for the rest) a message is INVALID_ARGUMENT
    before protobuf parses it."""
    big_name = "m" * (70 << 10)
    with grpc.insecure_channel(conv_server.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for call in (
            lambda: health.Check(health_pb2.HealthCheckRequest(service="c" * 2000), timeout=10),
            lambda: next(health.Watch(health_pb2.HealthCheckRequest(service="c" * 2000), timeout=10)),
        ):
            with pytest.raises(grpc.RpcError) as refused:
                call()
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "takes at most 1024" in (refused.value.details() or "")
        assert health.Check(health_pb2.HealthCheckRequest(service="conv"), timeout=10).status == (
            health_pb2.HealthCheckResponse.SERVING
        )
        metadata = pb_grpc.GRPCInferenceServiceStub(channel).ModelMetadata
        with pytest.raises(grpc.RpcError) as refused:
            metadata(pb.ModelMetadataRequest(name=big_name), timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "takes at most 65536" in (refused.value.details() or "")
        assert metadata(pb.ModelMetadataRequest(name="conv"), timeout=10).name == "conv"
        info = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo
        with pytest.raises(grpc.RpcError) as refused:
            list(info(iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol=big_name)]), timeout=10))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "takes at most 65536" in (refused.value.details() or "")
        (listing,) = info(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10)
        assert "grpc.health.v1.Health" in {s.name for s in listing.list_services_response.service}


def test_one_address_holding_calls_on_the_inference_port_cannot_block_another(runtime_factory, model_dirs) -> None:
    """Peer 127.0.0.2 opens as many header-only ModelInfer calls as the server takes at once (25 here: a queue of
    8, one worker of batch 1, plus 16). Before the per-address cap its first 8 held the whole queue (a call holds
    a queue place while its message arrives) and every other client was RESOURCE_EXHAUSTED for the 30 s receive
    timeout; now it holds half the queue (4), its 5th and later calls are refused at once, and another client is
    served throughout."""
    runtime = runtime_factory(
        model_dirs["conv"], "conv", "--workers", "1", "--max-batch-size", "1", "--max-queue-size", "8",
        "--receive-timeout-s", "30",
    )  # fmt: skip
    runtime.wait_serving()
    holder = Connection(runtime.target, "127.0.0.2")
    try:
        held = [holder.open("/inference.GRPCInferenceService/ModelInfer") for _ in range(25)]
        time.sleep(1.0)  # every call's headers are in
        ended = [s for s in held if s.ended is not None]
        assert len(ended) == 25 - 4, f"{len(ended)} of the holder's calls were refused, expected 21"
        assert all(s.ended - s.opened < 0.9 for s in ended)  # type: ignore[operator]  # at once, not at the timeout
        with SkiffClient(runtime.target) as client:  # another address: served, inference and health
            started = time.monotonic()
            assert client.infer("conv", {"image": np.ones((1, 3, 32, 32), np.float32)})["fetch_name_0"].shape == (1, 10)
            assert time.monotonic() - started < 5
        with grpc.insecure_channel(runtime.target) as channel:
            check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="conv"), timeout=5)
            assert check.status == health_pb2.HealthCheckResponse.SERVING
        assert sum(s.ended is None for s in held) == 4  # the holder's own places are still held
    finally:
        holder.close()
    assert runtime.terminate() == 0
