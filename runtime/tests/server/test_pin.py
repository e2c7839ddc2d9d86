"""A request pinned to a version (the `skiff-version` header, or the request's own version field) is answered by
that version and refused with NOT_FOUND, and how to reach the version, by a runtime serving another one."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from skiff_runtime.codec import encode_request
from skiff_runtime.proto import inference_pb2 as pb
from skiff_runtime.proto import inference_pb2_grpc
from skiff_runtime.server.pin import pinned_version
from skiff_runtime.tensors import Datatype, Tensor

IMAGE = Tensor("image", Datatype.FP32, np.ones((1, 3, 32, 32), np.float32))


@pytest.mark.parametrize(
    ("metadata", "pinned"),
    [
        ((), None),
        (None, None),
        ((("authorization", "Bearer x"),), None),
        ((("skiff-version", "v2"),), "v2"),
        ((("skiff-version", b"v2"),), "v2"),
        ((("skiff-version", "v2"), ("skiff-version", "v3")), "v2"),
    ],
)
def test_the_first_pin_header_is_the_pinned_version(metadata: object, pinned: str | None) -> None:
    assert pinned_version(metadata) == pinned


@pytest.fixture(scope="module")
def stub(conv_server):  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(conv_server.target) as channel:
        yield inference_pb2_grpc.GRPCInferenceServiceStub(channel)


def _infer(stub, *, header: str | None = None, version: str = "") -> pb.ModelInferResponse:  # type: ignore[no-untyped-def]
    metadata = [("skiff-version", header)] if header is not None else None
    return stub.ModelInfer(encode_request("conv", [IMAGE], model_version=version), timeout=30, metadata=metadata)


@pytest.mark.parametrize(("header", "version"), [(None, ""), ("1", ""), (None, "1"), ("1", "1")])
def test_a_request_pinned_to_the_served_version_is_answered_by_it(stub, header: str | None, version: str) -> None:  # type: ignore[no-untyped-def]
    assert _infer(stub, header=header, version=version).model_version == "1"


@pytest.mark.parametrize(
    ("header", "version", "message"),
    [
        ("v2", "", "this pod serves version '1' of model 'conv', not the version 'v2' its 'skiff-version' header pins; "
                   "to reach version 'v2', send the header 'skiff-version: <version>' to the model's gateway "
                   "(spec.routing Gateway mode), or call that version's own Service 'conv-v2'"),
        ("v2", "1", "not the version 'v2' its 'skiff-version' header pins"),
        (None, "v2", "model 'conv' has no version 'v2'; it serves version '1'; to reach version 'v2'"),
        ("x" * 300, "", "not the version 'xxxx"),
    ],
    ids=["header", "header-over-field", "field", "long-header"],
)  # fmt: skip
def test_a_request_pinned_to_another_version_is_refused_not_served(stub, header, version, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as caught:
        _infer(stub, header=header, version=version)
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND
    assert message in caught.value.details()
    assert len(caught.value.details()) < 600  # a long header is cut, not echoed whole


def test_metadata_rpcs_are_refused_for_another_pinned_version_too(stub) -> None:  # type: ignore[no-untyped-def]
    request = pb.ModelMetadataRequest(name="conv")
    assert stub.ModelMetadata(request, timeout=10, metadata=[("skiff-version", "1")]).name == "conv"
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelMetadata(request, timeout=10, metadata=[("skiff-version", "v2")])
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND
