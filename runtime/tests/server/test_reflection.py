"""Server reflection on a real runtime: a reflection client lists the services and calls one it learnt of."""

from __future__ import annotations

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
