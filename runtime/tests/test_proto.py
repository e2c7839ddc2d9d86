"""The wire contract: Skiff's messages match tritonclient's field for field, and generated code is fresh."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from tritonclient.grpc import model_config_pb2 as triton_config
from tritonclient.grpc import service_pb2 as triton_service

from skiff_runtime.proto import inference_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]


def _messages(module: object) -> dict[str, descriptor_pb2.DescriptorProto]:
    proto = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(proto)  # type: ignore[attr-defined]
    found: dict[str, descriptor_pb2.DescriptorProto] = {}

    def walk(prefix: str, messages: object) -> None:
        for message in messages:  # type: ignore[attr-defined]
            found[prefix + message.name] = message
            walk(prefix + message.name + ".", message.nested_type)

    walk("", proto.message_type)
    return found


def _fields(message: descriptor_pb2.DescriptorProto) -> dict[str, tuple[int, int, int, str]]:
    return {f.name: (f.number, f.type, f.label, f.type_name) for f in message.field}


OURS = _messages(pb)
THEIRS = {**_messages(triton_service), **_messages(triton_config)}


@pytest.mark.parametrize("name", sorted(OURS))
def test_message_matches_triton(name: str) -> None:
    assert name in THEIRS, f"{name} does not exist in Triton's protos"
    ours, theirs = _fields(OURS[name]), _fields(THEIRS[name])
    for field_name, spec in ours.items():
        assert field_name in theirs, f"{name}.{field_name} is not in Triton's {name}"
        assert spec == theirs[field_name], f"{name}.{field_name}: ours {spec} != Triton's {theirs[field_name]}"


def test_core_messages_are_complete() -> None:
    """Every field of the core OIP messages is present (subsets are allowed only for model-config messages)."""
    core = [
        n for n in OURS if n.split(".")[0] not in {"ModelConfig", "ModelInput", "ModelOutput", "ModelDynamicBatching"}
    ]
    for name in core:
        assert set(_fields(OURS[name])) == set(_fields(THEIRS[name])), name


def test_service_methods_match_triton() -> None:
    ours = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    theirs = triton_service.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert ours.full_name == "inference.GRPCInferenceService"
    for method in ours.methods:
        other = theirs.methods_by_name[method.name]
        assert method.input_type.full_name == other.input_type.full_name
        assert method.output_type.full_name == other.output_type.full_name


def test_skiff_and_tritonclient_coexist_in_one_process() -> None:
    """Skiff's descriptors live in a private pool, so both import without a duplicate-symbol error."""
    assert pb.ModelInferRequest.DESCRIPTOR.file.pool is not triton_service.DESCRIPTOR.pool
    wire = triton_service.ModelInferRequest(model_name="m", raw_input_contents=[b"abc"]).SerializeToString()
    assert pb.ModelInferRequest.FromString(wire).raw_input_contents == [b"abc"]


def test_generated_code_is_fresh() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
