"""The tutorial gRPC design's messages, built at run time with protobuf's dynamic API (no protoc, no .proto).

    package benchbaseline;
    message PredictRequest  { repeated int64 shape = 1; repeated float data = 2; }
    message PredictResponse { repeated int64 shape = 1; repeated float data = 2; }
    service Predictor { rpc Predict(PredictRequest) returns (PredictResponse); }

A private descriptor pool keeps these names away from every other generated module in the process.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

METHOD = "/benchbaseline.Predictor/Predict"


def _file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(name="benchbaseline.proto", package="benchbaseline", syntax="proto3")
    label, int64, float_ = (
        descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
        descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
        descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT,
    )
    for name in ("PredictRequest", "PredictResponse"):
        message = proto.message_type.add(name=name)
        message.field.add(name="shape", number=1, label=label, type=int64)
        message.field.add(name="data", number=2, label=label, type=float_)
    return proto


_pool = descriptor_pool.DescriptorPool()
_pool.Add(_file())
PredictRequest = message_factory.GetMessageClass(_pool.FindMessageTypeByName("benchbaseline.PredictRequest"))
PredictResponse = message_factory.GetMessageClass(_pool.FindMessageTypeByName("benchbaseline.PredictResponse"))
