"""Traces reach a real collector: a runtime process on loopback sends its spans over OTLP/gRPC to Jaeger 1.76.0
(devtools/jaeger.py), and Jaeger's query API answers the client's trace id with the request's span tree (gRPC and
REST), the caller's span as the parent, and the stages receive, queue, batch > engine, encode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from devtools.cluster import eventually, terminate
from devtools.jaeger import INSTALL_HINT, Jaeger, jaeger_binary
from devtools.traffic import INPUT, write_sample_model

from skiff_runtime.client import SkiffClient
from skiff_runtime.codec import encode_request
from skiff_runtime.proto import inference_pb2_grpc as pb_grpc
from skiff_runtime.tensors import Datatype, Tensor

CLIENT_TRACE = "5b8aa5a2d2c872e8321cf37308d69df2"
STAGES = ["receive", "queue", "batch", "engine", "encode"]


@pytest.fixture(scope="module")
def jaeger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jaeger]:
    binary = jaeger_binary()
    if binary is None:
        reason = f"jaeger is not built (`make controlplane` builds it); run: {INSTALL_HINT}"
        if os.environ.get("SKIFF_E2E_REQUIRED") == "1":
            pytest.fail(reason + " (SKIFF_E2E_REQUIRED=1: e2e tests must run)", pytrace=False)
        pytest.skip(reason)
    collector = Jaeger(tmp_path_factory.mktemp("jaeger"), binary)
    collector.start()
    yield collector
    collector.stop()


def _serve(model_dir: Path, log_path: Path, endpoint: str) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    command = [sys.executable, "-m", "skiff_runtime", "serve", "--model-dir", str(model_dir), "--model-name", "traced",
               "--host", "127.0.0.1", "--grpc-port", "0", "--health-port", "0", "--metrics-port", "0",
               "--http-port", "0", "--workers", "1", "--worker-nice", "0", "--trace-endpoint", endpoint]  # fmt: skip
    process = subprocess.Popen(command, stderr=log_path.open("wb"), stdout=subprocess.DEVNULL)

    def listening() -> dict[str, Any] | None:
        assert process.poll() is None, log_path.read_text()
        lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
        return next((line for line in lines if line.get("msg") == "listening"), None)

    ports = eventually(listening, timeout=120, interval=0.1, what="the runtime's ports")
    with SkiffClient(f"127.0.0.1:{ports['health_port']}", timeout_s=2) as client:
        eventually(lambda: client.health("traced") == "SERVING", timeout=300, interval=0.2, what="the model SERVING")
    return process, ports


def _tree(trace: dict[str, Any], parent_span: str) -> tuple[dict[str, Any], dict[str, str], dict[str, int]]:
    """The request span whose parent is the client's span, each span below it by name -> its parent's name, and
    their durations (us)."""
    spans = {s["spanID"]: s for s in trace["spans"]}

    def parent_of(span: dict[str, Any]) -> str:
        return next((r["spanID"] for r in span["references"] if r["refType"] == "CHILD_OF"), "")

    [root] = [s for s in spans.values() if parent_of(s) == parent_span]
    names: dict[str, str] = {}
    durations: dict[str, int] = {}
    stack = [root["spanID"]]
    while stack:
        current = stack.pop()
        for span in spans.values():
            if parent_of(span) == current:
                names[span["operationName"]] = spans[current]["operationName"]
                durations[span["operationName"]] = span["duration"]
                stack.append(span["spanID"])
    return root, names, durations


def test_jaeger_answers_the_clients_trace_id_with_the_span_tree(jaeger: Jaeger, tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    write_sample_model(model_dir)
    process, ports = _serve(model_dir, tmp_path / "runtime.log", jaeger.otlp_endpoint)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{ports['grpc_port']}") as channel:
            request = encode_request("traced", [Tensor("image", Datatype.FP32, INPUT[:1])])
            request.parameters["skiff_timing"].bool_param = True
            reply = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
                request, metadata=[("traceparent", f"00-{CLIENT_TRACE}-1000000000000001-01")], timeout=30
            )
        body = {"inputs": [{"name": "image", "shape": [1, 3, 32, 32], "datatype": "FP32",
                            "data": INPUT[:1].reshape(-1).tolist()}]}  # fmt: skip
        post = urllib.request.Request(
            f"http://127.0.0.1:{ports['http_port']}/v2/models/traced/infer",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "traceparent": f"00-{CLIENT_TRACE}-1000000000000002-01"},
        )
        with urllib.request.urlopen(post, timeout=30) as response:
            assert response.status == 200
    finally:
        terminate(process, timeout=60)  # SIGTERM: the runtime sends the spans it still holds
    started = time.monotonic()

    def complete() -> dict[str, Any] | None:
        trace = jaeger.trace(CLIENT_TRACE)
        return trace if trace is not None and len(trace["spans"]) >= 12 else None

    trace = eventually(complete, timeout=30, interval=0.5, what=f"trace {CLIENT_TRACE} in jaeger ({jaeger.log_path})")
    print(f"trace in jaeger {time.monotonic() - started:.1f} s after the runtime stopped")
    assert trace["traceID"] == CLIENT_TRACE
    assert {p["serviceName"] for p in trace["processes"].values()} == {"skiff-runtime"}
    for parent_span, name in (("1000000000000001", "ModelInfer"), ("1000000000000002", "infer")):
        root, names, durations = _tree(trace, parent_span)
        assert root["operationName"] == name
        assert names == {"receive": name, "queue": name, "batch": name, "engine": "batch", "encode": name}
        print(name, f"{root['duration']} us:", {stage: durations[stage] for stage in STAGES})
    timing = {key: value.int64_param for key, value in reply.parameters.items()}
    print("timing answer:", timing)
    assert timing["batch_size"] == 1
    assert timing["compute_us"] > 0
