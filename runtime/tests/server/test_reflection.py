"""Server reflection on a real runtime: a reflection client lists the services and calls one it learnt of."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from skiff_runtime.proto import inference_pb2
from skiff_runtime.server.reflection import pool_of

pytestmark = [pytest.mark.paddle, pytest.mark.server]

EXPECTED_SERVICES = {
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
    "inference.GRPCInferenceService",
    "tensorflow.serving.ModelService",
    "tensorflow.serving.PredictionService",
}


def test_reflection_lists_every_service_of_the_inference_port(conv_server) -> None:
    with grpc.insecure_channel(conv_server.target) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        assert set(database.get_services()) >= EXPECTED_SERVICES
        pool = descriptor_pool.DescriptorPool(database)
        infer = pool.FindServiceByName("inference.GRPCInferenceService")
        assert {"ModelInfer", "ModelMetadata", "ServerLive", "ModelConfig"} <= {m.name for m in infer.methods}
        assert {m.name for m in pool.FindServiceByName("grpc.health.v1.Health").methods} >= {"Check", "Watch"}
        predict = pool.FindServiceByName("tensorflow.serving.PredictionService").methods_by_name["Predict"]
        assert predict.input_type.fields_by_name["inputs"].message_type.fields_by_name[
            "value"
        ].message_type.full_name == ("tensorflow.TensorProto")


def test_a_call_built_only_from_reflection_works(conv_server) -> None:
    """What grpcurl does: learn the request and response types by reflection, then call with them."""
    with grpc.insecure_channel(conv_server.target) as channel:
        pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
        method = pool.FindServiceByName("inference.GRPCInferenceService").methods_by_name["ModelMetadata"]
        request_class = message_factory.GetMessageClass(method.input_type)
        response_class = message_factory.GetMessageClass(method.output_type)
        call = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelMetadata",
            request_serializer=request_class.SerializeToString,
            response_deserializer=response_class.FromString,
        )
        reply = call(request_class(name="conv"), timeout=10)
    assert reply.name == "conv"
    assert [(t.name, t.datatype) for t in reply.inputs] == [("image", "FP32")]


def test_reflection_on_an_unknown_symbol_says_not_found(conv_server) -> None:
    with grpc.insecure_channel(conv_server.target) as channel:
        pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
        with pytest.raises(KeyError):
            pool.FindServiceByName("nope.Service")


def test_pool_of_holds_each_service_with_its_imports() -> None:
    """Pure: the files of services from two pools (Skiff's own and protobuf's default) in one pool."""
    from grpc_health.v1 import health_pb2

    pool = pool_of(
        [
            inference_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"],
            health_pb2.DESCRIPTOR.services_by_name["Health"],
        ]
    )
    assert pool.FindServiceByName("grpc.health.v1.Health").methods_by_name["Check"].input_type.name == (
        "HealthCheckRequest"
    )
    request = pool.FindMessageTypeByName("inference.ModelInferRequest")
    assert request.fields_by_name["raw_input_contents"].number == 7


@pytest.fixture(scope="module")
def grpcurl(go_tool) -> str:
    """grpcurl built from the Go module proxy (scripts/gotool.sh; cached after the first build)."""
    return go_tool("grpcurl")


def _grpcurl(grpcurl: str, target: str, *words: str, data: str | None = None) -> str:
    flags = ["-plaintext", *(["-d", data] if data is not None else [])]
    done = subprocess.run([grpcurl, *flags, target, *words], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_grpcurl_lists_describes_and_calls_by_reflection(grpcurl: str, two_io_server) -> None:
    target = two_io_server.target
    assert set(_grpcurl(grpcurl, target, "list").split()) >= EXPECTED_SERVICES
    assert "rpc Predict ( .tensorflow.serving.PredictRequest )" in _grpcurl(
        grpcurl, target, "describe", "tensorflow.serving.PredictionService"
    )
    metadata = json.loads(
        _grpcurl(grpcurl, target, "inference.GRPCInferenceService/ModelMetadata", data='{"name": "two_io"}')
    )
    assert [i["name"] for i in metadata["inputs"]] == ["features", "ids"]
    request = {
        "model_spec": {"name": "two_io"},
        "inputs": {
            "features": {"dtype": "DT_FLOAT", "tensor_shape": {"dim": [{"size": 1}, {"size": 4}]},
                         "float_val": [1, 2, 3, 4]},
            "ids": {"dtype": "DT_INT64", "tensor_shape": {"dim": [{"size": 1}, {"size": 2}]}, "int64_val": [5, 6]},
        },
        "output_filter": ["fetch_name_1"],
    }  # fmt: skip
    reply = json.loads(
        _grpcurl(grpcurl, target, "tensorflow.serving.PredictionService/Predict", data=json.dumps(request))
    )
    tensor = reply["outputs"]["fetch_name_1"]
    content = base64.b64decode(tensor.get("tensor_content") or tensor["tensorContent"])  # grpcurl versions differ
    assert int.from_bytes(content, "little", signed=True) == 34
    signatures = json.loads(
        _grpcurl(grpcurl, target, "tensorflow.serving.PredictionService/GetModelMetadata",
                 data='{"model_spec": {"name": "two_io"}, "metadata_field": ["signature_def"]}')
    )  # fmt: skip
    assert signatures["metadata"]["signature_def"]["@type"] == "type.googleapis.com/tensorflow.serving.SignatureDefMap"


async def _list_services(call: Any) -> Any:
    from grpc_reflection.v1alpha import reflection_pb2

    await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
    return await call.read()


@pytest.mark.server
async def test_reflection_streams_are_capped_and_end_when_idle() -> None:
    """In-process: a stream that sends nothing ends after the receive timeout; past the cap one is refused."""
    from grpc_reflection.v1alpha import reflection_pb2_grpc

    from skiff_runtime.server.reflection import add_reflection

    server = grpc.aio.server()
    add_reflection(server, [inference_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]], 0.3, max_streams=1)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            idle = stub.ServerReflectionInfo()
            await asyncio.sleep(0.1)
            second = stub.ServerReflectionInfo()
            with pytest.raises(grpc.aio.AioRpcError) as refused:  # on the headers: the write itself may hear it
                await _list_services(second)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert await asyncio.wait_for(idle.code(), 5) == grpc.StatusCode.OK  # ended by the server
            third = stub.ServerReflectionInfo()
            listed = await _list_services(third)
            assert "inference.GRPCInferenceService" in {s.name for s in listed.list_services_response.service}
            await third.done_writing()
    finally:
        await server.stop(0)
