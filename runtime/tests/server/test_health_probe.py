"""grpc_health_probe (the Go tool kubelet-style checks use) against a real runtime's plaintext health port."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from runtime.tests.fakes import images, worker_pids

from skiff_runtime.client import SkiffClient
from skiff_runtime.codec import encode_request
from skiff_runtime.proto import inference_pb2_grpc as pb_grpc
from skiff_runtime.tensors import Datatype, Tensor

pytestmark = [pytest.mark.paddle, pytest.mark.server, pytest.mark.slow, pytest.mark.timeout(900)]

# grpc_health_probe's documented exit codes (its README and main.go)
SERVING = 0
RPC_FAILURE = 3  # the Check RPC failed, e.g. NOT_FOUND for a service the server does not know
UNHEALTHY = 4  # the RPC answered, with a status other than SERVING


@pytest.fixture(scope="module")
def probe(go_tool) -> str:
    """grpc_health_probe built from the Go module proxy (scripts/gotool.sh; cached after the first build)."""
    return go_tool("grpc_health_probe")


def _probe(probe: str, target: str, service: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [probe, f"-addr={target}", f"-service={service}", "-connect-timeout=5s", "-rpc-timeout=5s"],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_probe_says_serving_for_the_model_and_the_server(probe: str, conv_server) -> None:
    for service in ("", "conv"):
        done = _probe(probe, conv_server.health_target, service)
        assert (done.returncode, done.stderr.strip()) == (SERVING, "status: SERVING")  # it reports on stderr


def test_probe_fails_for_a_service_the_pod_does_not_serve(probe: str, conv_server) -> None:
    done = _probe(probe, conv_server.health_target, "another-model")
    assert done.returncode == RPC_FAILURE, (done.stdout, done.stderr)
    assert "NotFound" in done.stderr or "NOT_FOUND" in done.stderr, done.stderr


def test_probe_fails_while_no_worker_can_run_a_batch(probe: str, runtime_factory, model_dirs) -> None:
    """A hung worker makes health NOT_SERVING until its replacement is warm; the probe sees both sides."""
    runtime = runtime_factory(model_dirs["conv"], "conv", "--workers", "1", "--batch-timeout-s", "1")
    runtime.wait_serving()
    assert _probe(probe, runtime.health_target, "conv").returncode == SERVING
    (worker,) = worker_pids(runtime)
    os.kill(worker, signal.SIGSTOP)  # hangs like an engine stuck in native code
    request = encode_request("conv", [Tensor("image", Datatype.FP32, images(0))])
    with grpc.insecure_channel(runtime.target) as channel, pytest.raises(grpc.RpcError) as caught:
        pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    unhealthy = _probe(probe, runtime.health_target, "conv")
    assert unhealthy.returncode == UNHEALTHY, (unhealthy.stdout, unhealthy.stderr)
    assert "NOT_SERVING" in unhealthy.stderr
    deadline = time.monotonic() + 90
    while _probe(probe, runtime.health_target, "conv").returncode != SERVING:
        assert time.monotonic() < deadline, Path(runtime.log_path).read_text()
        time.sleep(0.2)
    with SkiffClient(runtime.target) as client:
        assert client.infer("conv", {"image": images(0)})["fetch_name_0"].shape == (1, 10)
    assert runtime.terminate() == 0
