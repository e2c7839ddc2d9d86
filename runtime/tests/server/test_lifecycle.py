"""The runtime's life as Kubernetes sees it: health before and after warm-up, the probe port, SIGTERM, bad models."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from runtime.tests.fakes import images

from skiff_runtime.client import SkiffClient
from skiff_runtime.proto import inference_pb2 as pb
from skiff_runtime.proto import inference_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.paddle, pytest.mark.server]

STATUS = health_pb2.HealthCheckResponse.ServingStatus.Name


def test_health_watch_not_serving_then_serving_then_not_serving_on_sigterm(runtime_factory, model_dirs) -> None:
    runtime = runtime_factory(model_dirs["conv"], "conv")
    seen: list[str] = []
    with grpc.insecure_channel(runtime.health_target) as channel:
        stream = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service="conv"), timeout=120)
        for reply in stream:
            seen.append(STATUS(reply.status))
            if seen[-1] == "SERVING":
                with SkiffClient(runtime.target) as client:  # SERVING means the model answers now
                    assert client.infer("conv", {"image": images(0)})["fetch_name_0"].shape == (1, 10)
                runtime.proc.send_signal(15)
            if len(seen) > 1 and seen[-1] == "NOT_SERVING":
                break
    assert seen[0] == "NOT_SERVING", "health must not say SERVING before the model is loaded and warmed"
    assert seen[-2:] == ["SERVING", "NOT_SERVING"]
    assert runtime.proc.wait(timeout=60) == 0
    warm = [e for e in runtime.logs() if e.get("msg") == "model ready"]
    assert warm
    assert warm[0]["model"] == "conv"


def test_health_port_serves_only_health_and_answers_while_inference_is_busy(conv_server) -> None:
    with grpc.insecure_channel(conv_server.health_target) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            pb_grpc.GRPCInferenceServiceStub(channel).ServerLive(pb.ServerLiveRequest(), timeout=5)
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
        check = health_pb2_grpc.HealthStub(channel).Check
        assert STATUS(check(health_pb2.HealthCheckRequest(service=""), timeout=5).status) == "SERVING"
        with pytest.raises(grpc.RpcError) as unknown:
            check(health_pb2.HealthCheckRequest(service="another-model"), timeout=5)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND

        stop = threading.Event()

        def load() -> None:
            with SkiffClient(conv_server.target) as client:
                while not stop.is_set():
                    client.infer("conv", {"image": images(1, 8)})

        workers = [threading.Thread(target=load) for _ in range(6)]
        for worker in workers:
            worker.start()
        try:
            time.sleep(0.5)
            latencies = []
            for _ in range(20):
                started = time.perf_counter()
                reply = check(health_pb2.HealthCheckRequest(service="conv"), timeout=2)
                latencies.append(time.perf_counter() - started)
                assert STATUS(reply.status) == "SERVING"
        finally:
            stop.set()
            for worker in workers:
                worker.join()
    assert max(latencies) < 2.0


def test_sigterm_under_32_clients_answers_every_accepted_request_and_new_ones_go_elsewhere(
    runtime_factory, model_dirs
) -> None:
    runtime = runtime_factory(
        model_dirs["conv"], "conv", "--max-batch-size", "32", "--grace-period-s", "30", "--workers", "2"
    )
    runtime.wait_serving()
    outcomes: dict[int, list[str]] = {}
    details: list[str] = []
    started = threading.Barrier(33)

    def send(seed: int) -> None:
        mine = outcomes.setdefault(seed, [])
        # No client retries here: each outcome is the server's own answer to one attempt.
        with SkiffClient(runtime.target, timeout_s=60, channel=grpc.insecure_channel(runtime.target)) as client:
            started.wait()
            while len(mine) < 2000:
                try:
                    out = client.infer("conv", {"image": images(seed, 32)})["fetch_name_0"]
                    mine.append("ok" if out.shape == (32, 10) else "bad")
                except grpc.RpcError as exc:
                    mine.append(exc.code().name)
                    details.append(f"{exc.code().name}: {exc.details()}")
                    return

    threads = [threading.Thread(target=send, args=(n,)) for n in range(32)]
    for thread in threads:
        thread.start()
    started.wait()
    time.sleep(1.0)
    signalled = time.monotonic()
    runtime.proc.send_signal(15)
    for thread in threads:
        thread.join()
    assert runtime.proc.wait(timeout=60) == 0
    assert time.monotonic() - signalled < 30, "exited within the grace period"
    every = [o for mine in outcomes.values() for o in mine]
    # Every call the server received is answered. A call that reaches the port in the millisecond between the
    # shutdown's start and the client reading its GOAWAY is CANCELLED by grpc's core (never run, safe to retry:
    # docs/clients.md); each client stops at its first error, so that is at most one per client, and it is rare.
    assert set(every) <= {"ok", "UNAVAILABLE", "CANCELLED"}, f"never a dropped request: {details}"
    assert all(mine[-1] in {"UNAVAILABLE", "CANCELLED"} for mine in outcomes.values()), "no request after SIGTERM runs"
    assert every.count("CANCELLED") <= 8, f"only calls racing the GOAWAY: {details}"
    assert every.count("ok") >= 16
    assert any(e.get("msg") == "stopped" for e in runtime.logs())


def test_legacy_pdmodel_is_served(runtime_factory, model_dirs) -> None:
    runtime = runtime_factory(model_dirs["legacy"], "legacy")
    runtime.wait_serving()
    with SkiffClient(runtime.target) as client:
        inputs, outputs = client.metadata("legacy")
        assert [(t.name, list(t.shape)) for t in inputs] == [("image", [-1, 3, 32, 32])]
        out = client.infer("legacy", {"image": images(3)})[outputs[0].name]
    assert out.shape == (1, 10)
    assert abs(float(out.sum()) - 1.0) < 1e-5
    assert runtime.terminate() == 0


def test_unloadable_model_exits_with_a_clear_error(runtime_factory, tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"\0")
    runtime = runtime_factory(tmp_path, "broken")
    assert runtime.proc.wait(timeout=60) == 1
    errors = [e for e in runtime.logs() if e.get("level") == "error"]
    assert errors
    assert "no Paddle model" in str(errors[0]["error"])
    assert "weights.bin" in str(errors[0]["error"])


def test_launcher_sets_allocator_tuning_for_large_messages(conv_server) -> None:
    environ = Path(f"/proc/{conv_server.proc.pid}/environ").read_bytes().split(b"\0")
    assert b"MALLOC_MMAP_THRESHOLD_=16777216" in environ
    assert b"MALLOC_TRIM_THRESHOLD_=67108864" in environ


def test_connections_are_closed_with_goaway_at_their_max_age_and_clients_carry_on(runtime_factory, model_dirs) -> None:
    """--max-connection-age-s: a long-lived stream ends when its connection's age and grace are over (what moves
    clients to new pods as a Deployment scales); unary calls on the same channel reconnect and never fail."""
    runtime = runtime_factory(model_dirs["conv"], "conv", "--workers", "1", "--max-connection-age-s", "1",
                              "--max-connection-age-grace-s", "1")  # fmt: skip
    runtime.wait_serving()
    with grpc.insecure_channel(runtime.target) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service="conv"), timeout=60)
        started = time.monotonic()
        assert STATUS(next(watch).status) == "SERVING"
        with pytest.raises(grpc.RpcError) as ended:
            next(watch)
        assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "max connection age" in (ended.value.details() or "")
        assert time.monotonic() - started < 30
        with SkiffClient(runtime.target, channel=channel) as client:
            deadline = time.monotonic() + 4  # several connection ages
            calls = 0
            while time.monotonic() < deadline:
                assert client.infer("conv", {"image": images(calls)})["fetch_name_0"].shape == (1, 10)
                calls += 1
    assert calls > 10
    assert runtime.terminate() == 0
