"""Payload logging on a real runtime serving a real Paddle model: gRPC ModelInfer, V2 REST infer and TF Serving
Predict are written as one JSON line each (stdout, or POSTed to a real loopback HTTP endpoint), the logged request
replays through REST to the same outputs, bodies past the limit are cut and say so, the token is written nowhere,
and a sink that hangs or a rate past the limit drops lines (counted) without failing a request."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from runtime.tests.conftest import RuntimeProcess
from runtime.tests.server.test_tfserving import FEATURES, IDS, _request

from skiff_runtime.client import SkiffClient
from skiff_runtime.codec import decode_response, encode_request
from skiff_runtime.proto import inference_pb2_grpc as pb_grpc
from skiff_runtime.proto import tensorflow_serving_pb2_grpc as tfs_grpc
from skiff_runtime.tensors import Datatype, Tensor

pytestmark = [pytest.mark.paddle, pytest.mark.server]

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TOKEN = "tok-Zq8v1XyW3pL0-never-logged"


def _lines(path: Path, count: int, timeout_s: float = 15) -> list[dict[str, Any]]:
    """The payload lines of a runtime's stdout, once there are `count` of them."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = []
        for line in path.read_bytes().splitlines():
            if line.startswith(b"{"):
                entry = json.loads(line)
                if entry.get("kind") == "payload":
                    found.append(entry)
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _post(url: str, body: bytes, headers: dict[str, str] | None = None) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json", **(headers or {})}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


def _rest_body(rows: int, request_id: str) -> bytes:
    return json.dumps(
        {
            "id": request_id,
            "inputs": [
                {"name": "features", "shape": [rows, 4], "datatype": "FP32", "data": [0.5] * (4 * rows)},
                {"name": "ids", "shape": [rows, 2], "datatype": "INT64", "data": list(range(2 * rows))},
            ],
        }
    ).encode()


def _records(runtime: RuntimeProcess) -> dict[str, float]:
    """skiff_payload_log_records_total by result."""
    return {
        sample.labels["result"]: sample.value
        for sample in runtime.metric_samples()
        if sample.name == "skiff_payload_log_records_total"
    }


@contextmanager
def http_sink(delay_s: float = 0.0) -> Iterator[tuple[str, list[bytes]]]:
    """A real HTTP endpoint on loopback that keeps every POSTed body (after `delay_s`)."""
    bodies: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            time.sleep(delay_s)
            bodies.append(body)
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/payloads", bodies
    finally:
        server.shutdown()
        server.server_close()


def test_every_protocol_is_logged_and_the_logged_request_replays_through_rest(runtime_factory, model_dirs) -> None:
    runtime = runtime_factory(
        model_dirs["two_io"], "two_io", "--workers", "1", "--http-port", "0", "--payload-log-ratio", "1",
        "--payload-log-max-body-bytes", "600",
    )  # fmt: skip
    runtime.wait_serving()
    features = np.random.default_rng(3).standard_normal((2, 4), dtype=np.float32)
    ids = np.array([[1, 2], [3, 4]], np.int64)
    message = encode_request(
        "two_io", [Tensor("features", Datatype.FP32, features), Tensor("ids", Datatype.INT64, ids)], request_id="g-1"
    )
    with grpc.insecure_channel(runtime.target) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        traceparent = [("traceparent", f"00-{TRACE_ID}-00f067aa0ba902b7-01")]
        answer = decode_response(stub.ModelInfer(message, metadata=traceparent, timeout=30))
        _post(f"{runtime.http_url}/v2/models/two_io/infer", _rest_body(1, "r-1"))
        _post(f"{runtime.http_url}/v2/models/two_io/infer", _rest_body(32, "r-big"))  # past 600 bytes
        tfs_grpc.PredictionServiceStub(channel).Predict(_request(FEATURES, IDS), timeout=30)
        bad = encode_request("two_io", [Tensor("nope", Datatype.FP32, features)], request_id="g-bad")
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(bad, timeout=30)
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    lines = _lines(runtime.stdout_path, 5)
    assert len(lines) == 5, lines
    by_id = {line["id"]: line for line in lines if line["id"]}
    grpc_line, rest_line, big = by_id["g-1"], by_id["r-1"], by_id["r-big"]
    [tf_line] = [line for line in lines if line["protocol"] == "tfserving"]
    assert (grpc_line["protocol"], grpc_line["status"], grpc_line["trace_id"]) == ("grpc", "OK", TRACE_ID)
    assert (grpc_line["model"], grpc_line["version"]) == ("two_io", "1")
    assert grpc_line["duration_us"] > 0
    assert "truncated" not in grpc_line
    assert (rest_line["protocol"], rest_line["status"]) == ("rest", 200)
    assert tf_line["status"] == "OK"
    assert tf_line["request"]["inputs"][0]["shape"] == [3, 4]
    assert big["truncated"] == ["request", "response"]
    assert big["request"]["inputs"][0]["skiff_truncated_from"] == 128
    assert len(json.dumps(big["request"], separators=(",", ":"))) <= 600
    [failed] = [line for line in lines if line["status"] != "OK" and line["status"] != 200]  # refused on decode
    assert failed["status"] == "INVALID_ARGUMENT"
    assert "nope" in failed["error"]
    assert "response" not in failed

    # The logged request, POSTed as it is, answers the logged outputs, which are the gRPC answer's.
    replayed = _post(f"{runtime.http_url}/v2/models/two_io/infer", json.dumps(grpc_line["request"]).encode())
    assert replayed["outputs"] == grpc_line["response"]["outputs"]
    for output in replayed["outputs"]:
        np.testing.assert_allclose(np.array(output["data"]).reshape(output["shape"]), answer[output["name"]], rtol=1e-6)

    records = _records(runtime)
    assert records["written"] >= 6
    assert records["truncated"] == 1
    assert records["dropped"] == 0
    assert runtime.terminate() == 0


def test_the_http_sink_gets_the_lines_and_the_token_is_written_nowhere(runtime_factory, model_dirs, tmp_path) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text(TOKEN + "\n")
    with http_sink() as (url, bodies):
        runtime = runtime_factory(
            model_dirs["two_io"], "two_io", "--workers", "1", "--http-port", "0", "--auth-token-file", str(token_file),
            "--payload-log-ratio", "1", "--payload-log-sink", url,
        )  # fmt: skip
        runtime.wait_serving()
        with SkiffClient(runtime.target, timeout_s=30, token=TOKEN) as client:
            client.infer("two_io", {"features": FEATURES, "ids": IDS})
        headers = {"Authorization": f"Bearer {TOKEN}", "X-Api-Key": TOKEN}
        _post(f"{runtime.http_url}/v2/models/two_io/infer", _rest_body(1, "with-token"), headers)
        deadline = time.monotonic() + 15
        while sum(body.count(b"\n") for body in bodies) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert runtime.terminate() == 0
    lines = [json.loads(line) for body in bodies for line in body.splitlines()]
    assert sorted(line["protocol"] for line in lines) == ["grpc", "rest"]
    assert all(line["status"] in ("OK", 200) for line in lines)
    everything = b"".join(bodies) + runtime.stdout_path.read_bytes() + runtime.log_path.read_bytes()
    assert TOKEN.encode() not in everything
    assert b"authorization" not in b"".join(bodies).lower()


def test_a_hanging_sink_and_the_rate_limit_drop_lines_never_requests(runtime_factory, model_dirs) -> None:
    with http_sink(delay_s=5.0) as (url, _):
        runtime = runtime_factory(
            model_dirs["two_io"], "two_io", "--workers", "1", "--payload-log-ratio", "1",
            "--payload-log-sink", url, "--payload-log-max-per-second", "20",
        )  # fmt: skip
        runtime.wait_serving()
        started = time.monotonic()
        with SkiffClient(runtime.target, timeout_s=30) as client:
            for _ in range(300):
                client.infer("two_io", {"features": FEATURES, "ids": IDS})
        elapsed = time.monotonic() - started
        deadline = time.monotonic() + 15
        records = _records(runtime)
        while not records["dropped"] and time.monotonic() < deadline:  # the first POST gives up after 2 s
            time.sleep(0.2)
            records = _records(runtime)
        runtime.proc.kill()  # type: ignore[union-attr]
    # Every POST hangs past the 2 s timeout: its lines are dropped, and the requests went on regardless.
    assert records["written"] == 0
    assert records["dropped"] > 0
    assert records["rate_limited"] > 0
    assert elapsed < 30, elapsed  # 300 requests never waited for a 5 s POST
