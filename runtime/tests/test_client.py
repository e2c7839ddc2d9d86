"""The client against real gRPC servers on 127.0.0.1: gRPC's own retry policy, deadlines, numpy round trips."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import numpy as np
import pytest

from skiff_runtime.client import SkiffClient
from skiff_runtime.codec import decode_request, encode_response
from skiff_runtime.proto import inference_pb2 as pb
from skiff_runtime.proto import inference_pb2_grpc as pb_grpc
from skiff_runtime.tensors import InferResponse

pytestmark = pytest.mark.server


class FlakyEcho(pb_grpc.GRPCInferenceServiceServicer):
    """Answers UNAVAILABLE `failures` times, then echoes the inputs back as outputs; sleeps `delay_s` per call."""

    def __init__(self, failures: int = 0, delay_s: float = 0.0) -> None:
        self.failures = failures
        self.delay_s = delay_s
        self.calls = 0

    def ModelInfer(self, request: pb.ModelInferRequest, context: grpc.ServicerContext) -> pb.ModelInferResponse:
        self.calls += 1
        time.sleep(self.delay_s)
        if self.calls <= self.failures:
            context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")
        decoded = decode_request(request)
        return encode_response(InferResponse(request.model_name, "1", request.id, decoded.inputs))


@pytest.fixture
def echo_server() -> Iterator[tuple[str, FlakyEcho]]:
    servicer = FlakyEcho()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", servicer
    server.stop(0)


def test_unavailable_is_retried_by_grpc_service_config(echo_server) -> None:
    target, servicer = echo_server
    servicer.failures = 2
    with SkiffClient(target) as client:
        out = client.infer("echo", {"x": np.arange(6, dtype=np.int32).reshape(2, 3)})
    assert servicer.calls == 3
    np.testing.assert_array_equal(out["x"], np.arange(6, dtype=np.int32).reshape(2, 3))


def test_retries_are_bounded(echo_server) -> None:
    target, servicer = echo_server
    servicer.failures = 100
    with SkiffClient(target) as client, pytest.raises(grpc.RpcError) as caught:
        client.infer("echo", {"x": np.zeros(1, np.float32)})
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert servicer.calls == 4


def test_deadline_is_sent_with_the_request(echo_server) -> None:
    target, servicer = echo_server
    servicer.delay_s = 0.5
    with SkiffClient(target) as client, pytest.raises(grpc.RpcError) as caught:
        client.infer("echo", {"x": np.zeros(1, np.float32)}, timeout_s=0.1)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


@pytest.mark.parametrize(
    "array",
    [
        np.array([[True, False]]),
        np.arange(4, dtype=np.uint16),
        np.arange(4, dtype=np.int8) - 2,
        np.linspace(0, 1, 6, dtype=np.float16).reshape(2, 3),
        np.linspace(0, 1, 6, dtype=np.float64),
        np.array([b"a", b"", b"\x00\xff"], dtype=object),
    ],
    ids=["bool", "uint16", "int8", "fp16", "fp64", "bytes"],
)
def test_numpy_round_trip_for_each_datatype(echo_server, array) -> None:
    target, _ = echo_server
    with SkiffClient(target) as client:
        out = client.infer("echo", {"t": array})["t"]
    assert out.shape == array.shape
    assert out.tolist() == array.tolist()
