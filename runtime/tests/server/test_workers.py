"""Worker processes behind one endpoint: results match in-process inference, batching merges concurrent
requests, metrics are exported, and a worker that dies or hangs is replaced (its batch retried once, or failed
UNAVAILABLE) while one that cannot be replaced stops the server instead of leaving it half-broken."""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
from runtime.tests.fakes import child_processes, images, worker_pids

from skiff_runtime.client import SkiffClient
from skiff_runtime.codec import encode_request
from skiff_runtime.proto import inference_pb2_grpc as pb_grpc
from skiff_runtime.settings import RuntimeSettings
from skiff_runtime.tensors import Datatype, Tensor

pytestmark = [pytest.mark.paddle, pytest.mark.server]


def _nice(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def _sample(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize("workers", ["1", "2"])
def test_workers_answer_like_the_in_process_predictor(runtime_factory, model_dirs, workers) -> None:
    from skiff_runtime.predictor.paddle import PaddleEngine

    engine = PaddleEngine(RuntimeSettings(model_dir=model_dirs["conv"], model_name="conv"))
    runtime = runtime_factory(model_dirs["conv"], "conv", "--workers", workers, "--max-batch-size", "8")
    runtime.wait_serving()
    spawned = [pid for pid, cmd in child_processes(runtime.proc.pid) if "spawn_main" in cmd]
    assert len(spawned) == int(workers)  # one worker is a process too: a thread would stall the front (GIL)
    # Workers run below the front's priority (--worker-nice, default 10), so the front answers under full load.
    assert [_nice(pid) - _nice(runtime.proc.pid) for pid in spawned] == [10] * len(spawned)
    # Each engine says what it does with intermediate tensors, from whichever process holds it.
    choices = [e for e in runtime.logs() if e["msg"] == "intermediate tensors"]
    assert sorted(e["pid"] for e in choices) == sorted(spawned)
    assert {(e["mode"], e["setting"], e["max_batch_size"]) for e in choices} == {("keep", "auto", 8)}
    assert all(0 < float(str(e["estimated_mib_at_max_batch"])) < 8 for e in choices)
    # Expected outputs are computed up front, on this thread: the in-process predictor must not be shared
    # by the client threads (a shared Paddle predictor silently returns wrong answers).
    seeds = [offset * 100 + i for offset in range(8) for i in range(25)]
    expected = {seed: engine.run({"image": images(seed, 1 + seed % 3)})["fetch_name_0"] for seed in seeds}
    failures: list[tuple[int, float]] = []

    def client(offset: int) -> None:
        with SkiffClient(runtime.target) as c:
            for i in range(25):
                seed = offset * 100 + i
                got = c.infer("conv", {"image": images(seed, 1 + seed % 3)})["fetch_name_0"]
                if got.shape != expected[seed].shape or not np.allclose(got, expected[seed], rtol=1e-5, atol=1e-6):
                    failures.append((seed, float(np.abs(got - expected[seed]).max())))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, f"{len(failures)} of 200 answers differ from in-process inference: {failures[:5]}"

    text = _metrics(runtime.metrics_port)
    ok = 'grpc_code="OK",grpc_method="ModelInfer",grpc_service="inference.GRPCInferenceService",grpc_type="unary"'
    assert f"grpc_server_handled_total{{{ok}}} 200.0" in text
    assert _sample(text, "paddle_inference_time_ms_count") >= 1
    assert _sample(text, "skiff_batch_requests_sum") == 200
    assert _sample(text, "skiff_batch_size_sum") == sum(1 + (n * 100 + i) % 3 for n in range(8) for i in range(25))
    assert 'skiff_model_ready{model="conv",version="1"} 1.0' in text
    assert f"skiff_workers {float(workers)}" in text
    assert runtime.terminate() == 0


def test_concurrent_requests_are_merged_into_batches(runtime_factory, model_dirs) -> None:
    runtime = runtime_factory(model_dirs["conv"], "conv", "--workers", "1", "--max-batch-size", "16",
                              "--max-queue-delay-us", "20000")  # fmt: skip
    runtime.wait_serving()
    barrier = threading.Barrier(12)

    def client(seed: int) -> None:
        with SkiffClient(runtime.target) as c:
            barrier.wait()
            c.infer("conv", {"image": images(seed)})

    threads = [threading.Thread(target=client, args=(n,)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    text = _metrics(runtime.metrics_port)
    batches = _sample(text, "skiff_batch_requests_count")
    assert _sample(text, "skiff_batch_requests_sum") == 12
    assert batches < 12, f"12 concurrent requests ran as {batches} batches; expected merging"
    assert runtime.terminate() == 0


def test_rejected_requests_are_counted_by_code(conv_server) -> None:
    with SkiffClient(conv_server.target) as c, pytest.raises(grpc.RpcError):
        c.infer("conv", {"image": np.zeros((1, 3, 8, 8), np.float32)})
    # A refused call's status reaches the client when `context.abort` sends it, a moment before the handler's
    # metrics observer runs: scrape until the count shows up (what a Prometheus scrape sees a moment later).
    wanted = 'grpc_code="INVALID_ARGUMENT",grpc_method="ModelInfer"'
    deadline = time.monotonic() + 5
    text = _metrics(conv_server.metrics_port)
    while wanted not in text and time.monotonic() < deadline:
        time.sleep(0.05)
        text = _metrics(conv_server.metrics_port)
    assert wanted in text


def test_an_inference_rpc_is_counted_with_its_type_and_message_sizes(conv_server) -> None:
    request = encode_request("conv", [Tensor("image", Datatype.FP32, images(3))])
    labels = 'grpc_method="ModelInfer",grpc_service="inference.GRPCInferenceService",grpc_type="unary"'
    before = _metrics(conv_server.metrics_port)
    with grpc.insecure_channel(conv_server.target) as channel:
        response = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    deadline = time.monotonic() + 5  # the observer runs a moment after the answer left
    text = _metrics(conv_server.metrics_port)
    count = f"grpc_server_msg_sent_bytes_count{{{labels}}}"
    while _sample(text, count) == _sample(before, count) and time.monotonic() < deadline:
        time.sleep(0.05)
        text = _metrics(conv_server.metrics_port)
    received = f"grpc_server_msg_received_bytes_sum{{{labels}}}"
    sent = f"grpc_server_msg_sent_bytes_sum{{{labels}}}"
    assert _sample(text, received) - _sample(before, received) == request.ByteSize()
    assert _sample(text, sent) - _sample(before, sent) == response.ByteSize()


def _load(target: str, seconds: float, clients: int = 4) -> dict[str, int]:
    """`clients` threads sending batch-2 requests for `seconds`; their outcomes by status code."""
    codes: dict[str, int] = {}
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client(seed: int) -> None:
        with SkiffClient(target, channel=grpc.insecure_channel(target)) as c:
            while time.monotonic() < stop:
                try:
                    c.infer("conv", {"image": images(seed, 2)}, timeout_s=30)
                    code = "OK"
                except grpc.RpcError as exc:
                    code = exc.code().name
                with lock:
                    codes[code] = codes.get(code, 0) + 1

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return codes


def _health(runtime) -> str:
    with SkiffClient(runtime.health_target, timeout_s=5) as client:
        return client.health("conv")


def test_a_worker_killed_under_load_is_replaced_and_its_batch_retried(runtime_factory, model_dirs) -> None:
    runtime = runtime_factory(model_dirs["conv"], "conv", "--workers", "2", "--max-batch-size", "4")
    runtime.wait_serving()
    before = worker_pids(runtime)
    assert len(before) == 2
    outcomes: dict[str, int] = {}
    loader = threading.Thread(target=lambda: outcomes.update(_load(runtime.target, 12)))
    loader.start()
    time.sleep(2)
    os.kill(before[0], signal.SIGKILL)
    loader.join()
    print(f"SIGKILL under load: {outcomes}")
    # The killed worker's batch ran again on the other one: nothing that could be retried was lost.
    assert set(outcomes) == {"OK"}, outcomes
    assert outcomes["OK"] > 20
    deadline = time.monotonic() + 60
    while not [e for e in runtime.logs() if e.get("msg") == "worker process replaced"] and time.monotonic() < deadline:
        time.sleep(0.2)
    exited = [e for e in runtime.logs() if str(e.get("msg", "")).startswith("worker process exited")]
    assert exited[0]["exitcode"] == -signal.SIGKILL
    after = worker_pids(runtime)
    assert len(after) == 2
    assert before[0] not in after
    assert before[1] in after
    assert runtime.proc.poll() is None  # the pod stays up
    assert _health(runtime) == "SERVING"
    assert set(_load(runtime.target, 2, clients=2)) == {"OK"}  # both workers answer again
    text = _metrics(runtime.metrics_port)
    assert "skiff_workers 2.0" in text
    assert "skiff_worker_exits_total 1.0" in text
    assert runtime.terminate() == 0
    assert not child_processes(runtime.proc.pid), "no worker outlives the server"


def test_a_hung_worker_is_stopped_its_batch_unavailable_and_health_truthful(runtime_factory, model_dirs) -> None:
    runtime = runtime_factory(model_dirs["conv"], "conv", "--workers", "1", "--batch-timeout-s", "2")
    runtime.wait_serving()
    (worker,) = worker_pids(runtime)
    os.kill(worker, signal.SIGSTOP)  # hangs like an engine stuck in native code
    request = encode_request("conv", [Tensor("image", Datatype.FP32, images(0))])
    with SkiffClient(runtime.target) as client, grpc.insecure_channel(runtime.target) as plain:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as caught:  # a channel without SkiffClient's retry policy sees the status
            pb_grpc.GRPCInferenceServiceStub(plain).ModelInfer(request, timeout=30)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "more than 2 s" in caught.value.details()
        assert time.monotonic() - started < 15
        assert _health(runtime) == "NOT_SERVING"  # no worker can run a batch until the replacement is warm
        deadline = time.monotonic() + 90
        while _health(runtime) != "SERVING" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _health(runtime) == "SERVING"
        assert client.infer("conv", {"image": images(0)})["fetch_name_0"].shape == (1, 10)
    assert worker_pids(runtime) != [worker]
    assert runtime.proc.poll() is None
    assert runtime.terminate() == 0


def test_a_worker_that_cannot_be_replaced_stops_the_server(runtime_factory, model_dirs, tmp_path) -> None:
    import shutil

    model_dir = tmp_path / "conv"
    shutil.copytree(model_dirs["conv"], model_dir)
    runtime = runtime_factory(model_dir, "conv", "--workers", "2", "--grace-period-s", "5")
    runtime.wait_serving()
    shutil.rmtree(model_dir)  # the replacement will find no model to load
    os.kill(worker_pids(runtime)[0], signal.SIGKILL)
    assert runtime.proc.wait(timeout=60) == 1
    stopped = [
        e for e in runtime.logs() if e.get("msg") == "worker process cannot be replaced; stopping so the pod restarts"
    ]
    assert stopped
    assert not child_processes(runtime.proc.pid), "no worker outlives the server"
