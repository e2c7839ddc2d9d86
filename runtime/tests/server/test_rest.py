"""V2 REST on a real runtime: tritonclient.http unmodified (JSON and binary), raw JSON as curl sends it, bad input."""

from __future__ import annotations

import json
import logging
import re
import socket
import time
import urllib.error
import urllib.request

import aiohttp
import numpy as np
import pytest
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from skiff_runtime import errors
from skiff_runtime.client import SkiffClient
from skiff_runtime.server.rest import HTTP_STATUSES, RestServer, http_status_for

pytestmark = [pytest.mark.paddle, pytest.mark.server]


def _inputs(features: np.ndarray, ids: np.ndarray, binary: bool) -> list[triton_http.InferInput]:
    inputs = [
        triton_http.InferInput("features", list(features.shape), "FP32"),
        triton_http.InferInput("ids", list(ids.shape), "INT64"),
    ]
    inputs[0].set_data_from_numpy(features, binary_data=binary)
    inputs[1].set_data_from_numpy(ids, binary_data=binary)
    return inputs


def _call(url: str, method: str = "GET", body: bytes | None = None, headers: dict[str, str] | None = None):
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_http_works_unmodified_and_agrees_with_grpc(two_io_server, binary: bool) -> None:
    client = triton_http.InferenceServerClient(f"127.0.0.1:{two_io_server.http_port}")
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("two_io")
    assert client.is_model_ready("two_io", "1")
    metadata = client.get_model_metadata("two_io")
    assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]] == [
        ("features", "FP32", [-1, 4]),
        ("ids", "INT64", [-1, 2]),
    ]
    assert client.get_model_config("two_io")["max_batch_size"] == 8
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]

    features = np.random.default_rng(7).standard_normal((3, 4), dtype=np.float32)
    ids = np.arange(6, dtype=np.int64).reshape(3, 2) * 1_000_000_007
    outputs = [triton_http.InferRequestedOutput(n, binary_data=binary) for n in ("fetch_name_0", "fetch_name_1")]
    result = client.infer("two_io", _inputs(features, ids, binary), outputs=outputs, request_id="r-1")
    with SkiffClient(two_io_server.target) as grpc_client:
        expected = grpc_client.infer("two_io", {"features": features, "ids": ids})
    assert result.as_numpy("fetch_name_0").tobytes() == expected["fetch_name_0"].tobytes()
    np.testing.assert_array_equal(result.as_numpy("fetch_name_1"), ids.sum(axis=1, keepdims=True) * 3 + 1)
    assert result.get_response()["id"] == "r-1"

    only = client.infer("two_io", _inputs(features, ids, binary), outputs=[outputs[1]], model_version="1")
    assert only.as_numpy("fetch_name_0") is None
    with pytest.raises(InferenceServerException, match="no version '7'"):
        client.infer("two_io", _inputs(features, ids, binary), model_version="7")
    bad = [triton_http.InferInput("features", [3, 4], "FP32"), triton_http.InferInput("ids", [3, 2], "INT32")]
    bad[0].set_data_from_numpy(features, binary_data=binary)
    bad[1].set_data_from_numpy(ids.astype(np.int32), binary_data=binary)
    with pytest.raises(InferenceServerException, match="expected datatype INT64"):
        client.infer("two_io", bad)
    client.close()


def test_raw_json_as_curl_sends_it(two_io_server) -> None:
    body = {
        "inputs": [
            {"name": "features", "shape": [1, 4], "datatype": "FP32", "data": [[1, 2, 3, 4]]},
            {"name": "ids", "shape": [1, 2], "datatype": "INT64", "data": [5, 6]},
        ]
    }
    status, headers, reply = _call(
        f"{two_io_server.http_url}/v2/models/two_io/infer",
        "POST",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    assert status == 200, reply
    assert headers["Content-Type"].startswith("application/json")
    outputs = {o["name"]: o for o in json.loads(reply)["outputs"]}
    assert outputs["fetch_name_1"] == {"name": "fetch_name_1", "datatype": "INT64", "shape": [1, 1], "data": [34]}
    with SkiffClient(two_io_server.target) as grpc_client:
        expected = grpc_client.infer(
            "two_io", {"features": np.array([[1, 2, 3, 4]], np.float32), "ids": np.array([[5, 6]], np.int64)}
        )
    assert np.array(outputs["fetch_name_0"]["data"], np.float32).tobytes() == expected["fetch_name_0"].tobytes()

    assert _call(f"{two_io_server.http_url}/v2/health/live")[0] == 200
    assert _call(f"{two_io_server.http_url}/v2/health/ready")[0] == 200
    status, _, reply = _call(f"{two_io_server.http_url}/v2")
    assert json.loads(reply)["name"] == "skiff"


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("two_io/infer", b"{not json", 400, "not valid JSON"),
        ("two_io/infer", b"[1, 2]", 400, "must be a JSON object"),
        ("two_io/infer", b'{"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32", "data": [1]}]}',
         400, "'data' holds 1 elements, FP32[1, 4] needs 4"),
        ("two_io/infer", b'{"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32", "data": ["a"]}]}',
         400, "not FP32 values"),
        ("two_io/infer", b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}',
         400, "unknown input 'x'"),
        ("two_io/infer", b"[" * 100_000, 400, "more than 65536; send 'data' flat"),
        ("nope/infer", b"{}", 404, "unknown model 'nope'"),
        ("two_io/versions/9/ready", None, 404, "no version '9'"),
    ],
)  # fmt: skip
def test_bad_requests_get_a_clear_error(
    two_io_server, path: str, body: bytes | None, status: int, message: str
) -> None:
    method = "GET" if body is None else "POST"
    got, headers, reply = _call(f"{two_io_server.http_url}/v2/models/{path}", method, body)
    assert got == status, reply
    assert headers["Content-Type"].startswith("application/json")
    assert message in json.loads(reply)["error"]


@pytest.mark.parametrize(
    "length", ["1" * 4301, "\u00b2", "99999999999999999999"], ids=["4301-digits", "superscript", "huge"]
)
def test_an_unusable_header_length_is_a_400_that_says_what_to_send(two_io_server, length: str) -> None:
    """Once a 500 and a traceback per request (int() refuses 4,301 digits); now the client's own error."""
    body = b'{"inputs": []}'
    headers = {"Inference-Header-Content-Length": length, "Content-Type": "application/octet-stream"}
    status, _, reply = _call(f"{two_io_server.http_url}/v2/models/two_io/infer", "POST", body, headers)
    assert status == 400, reply
    assert "must be the length of the JSON header" in json.loads(reply)["error"]
    # The allowed variant: the same body with its true length reaches the decoder (which asks for inputs).
    headers["Inference-Header-Content-Length"] = str(len(body))
    status, _, reply = _call(f"{two_io_server.http_url}/v2/models/two_io/infer", "POST", body, headers)
    assert status == 400, reply
    assert "Inference-Header-Content-Length" not in json.loads(reply)["error"], reply


def test_a_body_over_the_message_limit_is_refused_413(two_io_server) -> None:
    status, _, reply = _call(f"{two_io_server.http_url}/v2/models/two_io/infer", "POST", b" " * (32 * 1024 * 1024 + 1))
    assert status == 413
    assert "--max-message-mb" in json.loads(reply)["error"]


def test_unknown_routes_are_404_in_json(two_io_server) -> None:
    status, _, reply = _call(f"{two_io_server.http_url}/v1/models/two_io")
    assert status == 404
    assert "Not Found" in json.loads(reply)["error"]


def test_every_error_type_has_an_http_status() -> None:
    kinds = [cls for cls in vars(errors).values() if isinstance(cls, type) and issubclass(cls, errors.SkiffError)]
    assert set(kinds) - {errors.SkiffError} == set(HTTP_STATUSES)
    assert http_status_for(errors.QueueFull("x")) == 429
    assert http_status_for(ValueError("x")) == 500


def _scrape(server) -> dict[str, float]:
    """The metrics page's samples, by name and labels (the text before the value)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as response:
        lines = response.read().decode().splitlines()
    return {k: float(v) for k, v in (line.rsplit(" ", 1) for line in lines if line and not line.startswith("#"))}


def test_rest_requests_are_counted_in_metrics(two_io_server) -> None:
    before = _scrape(two_io_server)  # the server is shared: other tests' requests are counted too
    _call(f"{two_io_server.http_url}/v2/models/nope/ready")
    _call(f"{two_io_server.http_url}/v2/models/two_io/infer", "POST", b"{}")
    after = _scrape(two_io_server)

    def grew(sample: str) -> float:
        return after.get(sample, 0.0) - before.get(sample, 0.0)

    assert grew('http_server_handled_total{code="404",route="/v2/models/{model}/ready"}') == 1
    assert grew('http_server_handled_total{code="400",route="/v2/models/{model}/infer"}') == 1
    assert grew('http_server_request_bytes_sum{route="/v2/models/{model}/infer"}') == 2  # the body b"{}"
    assert grew('http_server_request_bytes_count{route="/v2/models/{model}/infer"}') == 1
    assert grew('http_server_response_bytes_count{route="/v2/models/{model}/ready"}') == 1
    assert 'http_server_request_bytes_count{route="/v2/models/{model}/ready"}' not in after  # a GET: no body


def test_sigterm_answers_accepted_rest_requests_and_refuses_new_ones(runtime_factory, model_dirs) -> None:
    """As on gRPC: each REST client gets 200s, then 503 (or a closed port) once SIGTERM arrived; never a 500."""
    import threading
    import time

    runtime = runtime_factory(model_dirs["conv"], "conv", "--http-port", "0", "--grace-period-s", "20",
                              "--workers", "2", "--max-batch-size", "8")  # fmt: skip
    runtime.wait_serving()
    body = json.dumps(
        {"inputs": [{"name": "image", "shape": [1, 3, 32, 32], "datatype": "FP32", "data": [0.5] * 3072}]}
    ).encode()
    outcomes: dict[int, list[str]] = {}
    started = threading.Barrier(9)

    def send(index: int) -> None:
        mine = outcomes.setdefault(index, [])
        started.wait()
        while len(mine) < 500:
            try:
                status, _, _ = _call(f"{runtime.http_url}/v2/models/conv/infer", "POST", body)
            except (urllib.error.URLError, ConnectionError):
                mine.append("closed")
                return
            mine.append(str(status))
            if status != 200:
                return

    threads = [threading.Thread(target=send, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    started.wait()
    time.sleep(1.0)
    runtime.proc.send_signal(15)
    for thread in threads:
        thread.join(timeout=60)
    assert runtime.proc.wait(timeout=60) == 0
    every = [o for mine in outcomes.values() for o in mine]
    assert set(every) <= {"200", "503", "closed"}, every
    assert every.count("200") >= 8
    assert all(mine[-1] in ("503", "closed") for mine in outcomes.values())


class _BrokenService:
    """A service whose readiness raises what no handler expects, and whose model check says a known error."""

    name = "m"

    @property
    def ready(self) -> bool:
        raise RuntimeError("cannot stat /var/secret/tenant-b/model.pdiparams")

    def check_model(self, name: str, version: str) -> None:
        raise errors.ModelNotFound(f"unknown model {name!r}")


async def test_an_unexpected_error_is_a_500_with_an_incident_id_and_no_exception_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = RestServer(_BrokenService(), max_body_bytes=1024, receive_timeout_s=1.0)  # type: ignore[arg-type]
    port = await server.start("127.0.0.1", 0, 1.0)
    try:
        async with aiohttp.ClientSession() as session:
            with caplog.at_level(logging.ERROR):
                async with session.get(f"http://127.0.0.1:{port}/v2/health/ready") as response:
                    status, reply = response.status, await response.json()
            async with session.get(f"http://127.0.0.1:{port}/v2/models/x/ready") as known:
                known_status, known_reply = known.status, await known.json()
    finally:
        await server.stop()
    assert status == 500
    assert "secret" not in reply["error"]
    assert "RuntimeError" not in reply["error"]
    incident = re.fullmatch(r"internal error ([0-9a-f]{12}): retry, or report the id .*", reply["error"])
    assert incident is not None, reply
    logged = [r for r in caplog.records if getattr(r, "incident", None) == incident.group(1)]
    assert logged
    assert "tenant-b" in str(logged[0].exc_info[1])  # type: ignore[index]
    assert (known_status, known_reply["error"]) == (404, "unknown model 'x'")  # a SkiffError is said in full


def _announce(port: int, length: int) -> socket.socket:
    """A REST infer request whose headers announce `length` bytes of body, of which none is sent."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(
        b"POST /v2/models/two_io/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
        + f"Inference-Header-Content-Length: 100\r\nContent-Length: {length}\r\n\r\n".encode()
    )
    return sock


def test_bodies_are_charged_to_the_budget_from_their_content_length_before_they_arrive(
    runtime_factory, model_dirs
) -> None:
    """A 64 MiB budget: two requests announcing 30 MiB each (none of it sent) hold 60 MiB of it on their headers,
    so a third is refused 429 at once, before its body; a small request still fits and is served. Before, the
    budget was charged only once a body had arrived: all three were admitted and waited for 90 MiB together."""
    runtime = runtime_factory(
        model_dirs["two_io"], "two_io", "--workers", "1", "--http-port", "0", "--max-request-memory-mb", "64",
        "--receive-timeout-s", "30",
    )  # fmt: skip
    runtime.wait_serving()
    holders = [_announce(runtime.http_port, 30 << 20) for _ in range(2)]
    try:
        time.sleep(0.5)  # both admitted and charged
        third = _announce(runtime.http_port, 30 << 20)
        started = time.monotonic()
        reply = third.recv(65536)
        assert time.monotonic() - started < 5
        assert reply.startswith(b"HTTP/1.1 429"), reply[:200]
        assert b"request memory budget full" in reply
        third.close()
        body = {"inputs": [
            {"name": "features", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
            {"name": "ids", "shape": [1, 2], "datatype": "INT64", "data": [1, 2]},
        ]}  # fmt: skip
        status, _, answer = _call(f"{runtime.http_url}/v2/models/two_io/infer", "POST", json.dumps(body).encode())
        assert status == 200, answer
    finally:
        for sock in holders:
            sock.close()
    assert runtime.terminate() == 0
