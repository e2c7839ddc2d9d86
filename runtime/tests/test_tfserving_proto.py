"""The TF Serving wire contract: Skiff's tensorflow.serving messages and services match the descriptors PyPI's
tensorflow-serving-api (2.21) ships, field for field. They are read from its generated modules as data, without
importing them (the modules import TensorFlow, which the project never installs). TensorFlow's own core messages
(TensorProto, TensorShapeProto, DataType, SignatureDef) ship only inside TensorFlow; see runtime/proto/README.md."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2

from skiff_runtime.proto import tensorflow_core_pb2, tensorflow_error_pb2, tensorflow_serving_pb2

THEIR_MODULES = [
    "tensorflow_serving.apis.model_pb2",
    "tensorflow_serving.apis.predict_pb2",
    "tensorflow_serving.apis.get_model_metadata_pb2",
    "tensorflow_serving.apis.get_model_status_pb2",
    "tensorflow_serving.apis.status_pb2",
    "tensorflow_serving.apis.prediction_service_pb2",
    "tensorflow_serving.apis.model_service_pb2",
]


def _published(module: str) -> descriptor_pb2.FileDescriptorProto:
    spec = importlib.util.find_spec(module)
    assert spec is not None, f"{module} is not installed (a dev dependency: run `make setup`)"
    assert spec.origin
    source = Path(spec.origin).read_text()
    match = re.search(r"AddSerializedFile\((b'.*?')\)\n", source)
    assert match, f"{module}: no serialized descriptor found"
    return descriptor_pb2.FileDescriptorProto.FromString(ast.literal_eval(match.group(1)))


def _ours(module: object) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(proto)  # type: ignore[attr-defined]
    return proto


def _index(files: list[descriptor_pb2.FileDescriptorProto]) -> tuple[dict[str, object], dict[str, object], dict]:
    messages: dict[str, object] = {}
    enums: dict[str, object] = {}
    services: dict[str, object] = {}

    def walk(prefix: str, items: object, nested_enums: object) -> None:
        for enum in nested_enums:  # type: ignore[attr-defined]
            enums[prefix + enum.name] = enum
        for message in items:  # type: ignore[attr-defined]
            if message.options.map_entry:
                continue
            messages[prefix + message.name] = message
            walk(prefix + message.name + ".", message.nested_type, message.enum_type)

    for file in files:
        walk(file.package + ".", file.message_type, file.enum_type)
        for service in file.service:
            services[f"{file.package}.{service.name}"] = service
    return messages, enums, services


OURS = _index([_ours(tensorflow_serving_pb2)])
THEIRS = _index([_published(m) for m in THEIR_MODULES])


def _fields(message: object) -> dict[str, tuple[int, int, int, str]]:
    return {f.name: (f.number, f.type, f.label, f.type_name) for f in message.field}  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", sorted(OURS[0]))
def test_message_matches_published_field_for_field(name: str) -> None:
    assert name in THEIRS[0], f"{name} is not a published TF / TF Serving message"
    ours, theirs = _fields(OURS[0][name]), _fields(THEIRS[0][name])
    assert set(theirs) == set(ours), f"{name}: fields differ"
    for field, spec in ours.items():
        assert spec == theirs[field], f"{name}.{field}: ours {spec} != published {theirs[field]}"


@pytest.mark.parametrize("name", sorted(OURS[1]))
def test_enum_matches_published(name: str) -> None:
    ours = {v.name: v.number for v in OURS[1][name].value}  # type: ignore[attr-defined]
    theirs = {v.name: v.number for v in THEIRS[1][name].value}  # type: ignore[attr-defined]
    assert ours == theirs


def test_references_to_tensorflow_core_name_skiffs_copies() -> None:
    """Every tensorflow.* type the published serving messages use is defined in Skiff's tensorflow_core.proto."""
    referenced: set[str] = set()

    def walk(messages: object) -> None:
        for message in messages:  # type: ignore[attr-defined]
            referenced.update(f.type_name.lstrip(".") for f in message.field if f.type_name.startswith(".tensorflow."))
            walk(message.nested_type)

    for module in THEIR_MODULES:
        walk(_published(module).message_type)
    referenced = {name for name in referenced if not name.startswith("tensorflow.serving.")}
    assert {"tensorflow.TensorProto", "tensorflow.SignatureDef", "tensorflow.error.Code"} <= referenced
    core = tensorflow_core_pb2.DESCRIPTOR
    defined = {f"tensorflow.{n}" for n in [*core.message_types_by_name, *core.enum_types_by_name]}
    assert referenced - {"tensorflow.error.Code"} <= defined
    assert "tensorflow.error.Code" in {e.full_name for e in tensorflow_error_pb2.DESCRIPTOR.enum_types_by_name.values()}


def test_error_codes_are_grpc_status_codes() -> None:
    """tensorflow.error.Code uses gRPC's numbering."""
    for code in grpc.StatusCode:
        assert tensorflow_error_pb2.Code.Value(code.name) == code.value[0]


@pytest.mark.parametrize("name", sorted(OURS[2]))
def test_service_methods_are_published_ones(name: str) -> None:
    theirs = {m.name: (m.input_type, m.output_type) for m in THEIRS[2][name].method}  # type: ignore[attr-defined]
    for method in OURS[2][name].method:  # type: ignore[attr-defined]
        assert theirs[method.name] == (method.input_type, method.output_type), method.name
    served = {m.name for m in OURS[2][name].method}  # type: ignore[attr-defined]
    assert (
        served
        == {
            "tensorflow.serving.PredictionService": {"Predict", "GetModelMetadata"},
            "tensorflow.serving.ModelService": {"GetModelStatus"},
        }[name]
    )
