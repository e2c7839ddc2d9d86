"""Request traces and timing on a real runtime: spans reach a real OTLP/gRPC receiver under the caller's trace id
(gRPC metadata, REST headers, TF Serving Predict) with the stage tree, a merged batch links its requests, sampling
follows the caller's flag, and `skiff_timing` answers queue, batch size, engine and total time on gRPC and REST."""

from __future__ import annotations

import json
import threading
import urllib.request

import grpc
import numpy as np
import pytest
from runtime.tests.otlp import ReceivedSpan, otlp_receiver
from runtime.tests.server.test_tfserving import FEATURES, IDS, _request

from skiff_runtime.codec import encode_request
from skiff_runtime.proto import inference_pb2 as pb
from skiff_runtime.proto import inference_pb2_grpc as pb_grpc
from skiff_runtime.proto import tensorflow_serving_pb2_grpc as tfs_grpc
from skiff_runtime.tensors import Datatype, Tensor
from skiff_runtime.timing import TIMING_HEADERS

pytestmark = [pytest.mark.paddle, pytest.mark.server]

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
STAGES = {"receive", "queue", "batch", "encode"}


def traceparent(span_id: str, sampled: bool = True, trace_id: str = TRACE_ID) -> str:
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}"


def _infer_request(timing: bool | None = None, rows: int = 1) -> pb.ModelInferRequest:
    features = np.ones((rows, 4), np.float32)
    ids = np.arange(2 * rows, dtype=np.int64).reshape(rows, 2)
    message = encode_request(
        "two_io", [Tensor("features", Datatype.FP32, features), Tensor("ids", Datatype.INT64, ids)]
    )
    if timing is not None:
        message.parameters["skiff_timing"].bool_param = timing
    return message


def _rest_body(timing: bool) -> bytes:
    body: dict[str, object] = {
        "inputs": [
            {"name": "features", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
            {"name": "ids", "shape": [1, 2], "datatype": "INT64", "data": [5, 6]},
        ]
    }
    if timing:
        body["parameters"] = {"skiff_timing": True}
    return json.dumps(body).encode()


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[dict[str, str], dict[str, object]]:
    headers = {"Content-Type": "application/json", **headers}
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        return dict(response.headers), json.loads(response.read())


def _tree(spans: list[ReceivedSpan], root: ReceivedSpan) -> dict[str, ReceivedSpan]:
    """The root's children by name, and its batch's engine child as 'engine'."""
    children = {s.name: s for s in spans if s.parent_id == root.span_id}
    batch = children.get("batch")
    if batch is not None:
        children.update({s.name: s for s in spans if s.parent_id == batch.span_id})
    return children


def _roots(spans: list[ReceivedSpan], parent: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.parent_id == parent]


def test_requests_are_traced_under_the_callers_trace_id_with_every_stage(runtime_factory, model_dirs) -> None:
    with otlp_receiver() as (receiver, endpoint):
        runtime = runtime_factory(
            model_dirs["two_io"], "two_io", "--workers", "1", "--http-port", "0", "--trace-endpoint", endpoint,
            "--trace-service-name", "skiff-test", "--max-queue-delay-us", "300000",
        ).start()  # fmt: skip
        runtime.wait_serving()
        with grpc.insecure_channel(runtime.target) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            stub.ModelInfer(_infer_request(), metadata=[("traceparent", traceparent("00f067aa0ba902b7"))], timeout=30)
            _post(
                f"{runtime.http_url}/v2/models/two_io/infer",
                _rest_body(False),
                {"traceparent": traceparent("00f067aa0ba902b8")},
            )
            tfs_grpc.PredictionServiceStub(channel).Predict(
                _request(FEATURES, IDS), metadata=[("traceparent", traceparent("00f067aa0ba902b9"))], timeout=30
            )
            # Two requests inside the 300 ms batching window share one batch.
            calls = [
                threading.Thread(
                    target=stub.ModelInfer,
                    args=(_infer_request(rows=2),),
                    kwargs={"metadata": [("traceparent", traceparent(f"00000000000000c{i}"))], "timeout": 30},
                )
                for i in range(2)
            ]
            for call in calls:
                call.start()
            for call in calls:
                call.join()
            # Without a traceparent, a new trace (ratio 1).
            stub.ModelInfer(_infer_request(), timeout=30)

        def complete(spans: list[ReceivedSpan]) -> bool:
            roots = [s for s in spans if s.name in ("ModelInfer", "infer", "Predict")]
            return len(roots) >= 6 and sum(s.name == "encode" for s in spans) >= 6

        assert runtime.terminate() == 0  # the spans still buffered leave on shutdown
        spans = receiver.wait_for(complete, timeout_s=5)

    [grpc_root] = _roots(spans, "00f067aa0ba902b7")
    [rest_root] = _roots(spans, "00f067aa0ba902b8")
    [tf_root] = _roots(spans, "00f067aa0ba902b9")
    roots = ((grpc_root, "ModelInfer", 1), (rest_root, "infer", 1), (tf_root, "Predict", len(FEATURES)))
    for root, name, rows in roots:
        assert root.name == name
        assert root.trace_id == TRACE_ID
        assert root.service == "skiff-test"
        tree = _tree(spans, root)
        assert STAGES | {"engine"} <= set(tree), (name, sorted(tree))
        assert all(s.trace_id == TRACE_ID for s in tree.values())
        assert root.start_ns <= tree["receive"].start_ns <= tree["queue"].start_ns <= tree["batch"].start_ns
        assert tree["batch"].start_ns <= tree["engine"].start_ns <= tree["engine"].end_ns <= tree["batch"].end_ns
        assert tree["batch"].end_ns <= tree["encode"].start_ns <= tree["encode"].end_ns <= root.end_ns
        assert tree["engine"].end_ns > tree["engine"].start_ns  # measured in the worker process
        assert tree["batch"].attributes["skiff.batch.size"] == rows
    assert grpc_root.attributes["rpc.system"] == "grpc"
    assert rest_root.attributes["rpc.system"] == "http"

    merged = [_roots(spans, f"00000000000000c{i}")[0] for i in range(2)]
    batches = [_tree(spans, root)["batch"] for root in merged]
    assert [b.attributes["skiff.batch.size"] for b in batches] == [4, 4]
    assert [b.attributes["skiff.batch.requests"] for b in batches] == [2, 2]
    assert batches[0].links == ((TRACE_ID, merged[1].span_id),)
    assert batches[1].links == ((TRACE_ID, merged[0].span_id),)

    [fresh] = [s for s in spans if s.name == "ModelInfer" and s.parent_id == ""]
    assert fresh.trace_id != TRACE_ID


def test_sampling_follows_the_callers_flag_then_the_ratio(runtime_factory, model_dirs) -> None:
    with otlp_receiver() as (receiver, endpoint):
        runtime = runtime_factory(
            model_dirs["two_io"], "two_io", "--workers", "1", "--trace-endpoint", endpoint,
            "--trace-sampling-ratio", "0",
        ).start()  # fmt: skip
        runtime.wait_serving()
        with grpc.insecure_channel(runtime.target) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            stub.ModelInfer(_infer_request(), timeout=30)  # ratio 0: not traced
            stub.ModelInfer(_infer_request(), metadata=[("traceparent", traceparent("0000000000000a00", False))])
            stub.ModelInfer(_infer_request(), metadata=[("traceparent", traceparent("0000000000000a01"))])
        assert runtime.terminate() == 0
        spans = receiver.wait_for(lambda spans: any(s.name == "encode" for s in spans), timeout_s=5)
    roots = [s for s in spans if s.name == "ModelInfer"]
    assert [r.parent_id for r in roots] == ["0000000000000a01"]


def test_timing_is_answered_on_grpc_only_when_asked(two_io_server) -> None:
    with grpc.insecure_channel(two_io_server.target) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        asked = stub.ModelInfer(_infer_request(timing=True, rows=3), timeout=30)
        plain = stub.ModelInfer(_infer_request(), timeout=30)
        declined = stub.ModelInfer(_infer_request(timing=False), timeout=30)
    timing = {key: value.int64_param for key, value in asked.parameters.items()}
    assert set(timing) == {"queue_us", "batch_size", "compute_us", "total_us"}
    assert timing["batch_size"] == 3
    assert 0 < timing["compute_us"] < timing["total_us"] < 10_000_000
    assert timing["queue_us"] + timing["compute_us"] <= timing["total_us"]
    assert len(asked.raw_output_contents) == 2
    assert dict(plain.parameters) == {}
    assert dict(declined.parameters) == {}


def test_timing_is_answered_on_rest_in_parameters_and_headers(two_io_server) -> None:
    url = f"{two_io_server.http_url}/v2/models/two_io/infer"
    headers, body = _post(url, _rest_body(True), {})
    parameters = body["parameters"]
    assert isinstance(parameters, dict)
    assert set(parameters) == set(TIMING_HEADERS)
    assert parameters["batch_size"] == 1
    assert 0 < parameters["compute_us"] < parameters["total_us"]
    assert {name: int(headers[header]) for name, header in TIMING_HEADERS.items()} == parameters
    headers, body = _post(url, _rest_body(False), {})
    assert "parameters" not in body
    assert not any(header in headers for header in TIMING_HEADERS.values())
