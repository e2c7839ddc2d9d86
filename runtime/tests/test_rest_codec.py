"""V2 REST bodies <-> domain, pure: JSON and binary inputs, the signature checks shared with gRPC, output encoding."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from skiff_runtime.codec import encode_tensor_bytes
from skiff_runtime.errors import InvalidInput
from skiff_runtime.model_config import model_config
from skiff_runtime.rest_codec import (
    MAX_JSON_BYTES,
    decode_infer_body,
    encode_infer_body,
    model_config_body,
    parse_header_length,
)
from skiff_runtime.tensors import Datatype, InferResponse, ModelSignature, Tensor, TensorSpec
from skiff_runtime.validation import ModelContract

SIGNATURE = ModelSignature(
    inputs=(TensorSpec("x", Datatype.FP32, (-1, 2)), TensorSpec("ids", Datatype.INT64, (-1, 1))),
    outputs=(TensorSpec("y", Datatype.FP32, (-1, 1)), TensorSpec("s", Datatype.BYTES, (-1,))),
)
CONTRACT = ModelContract(SIGNATURE, 4)


def _decode(header: dict[str, object], binary: bytes = b"", version: str = ""):
    text = json.dumps(header).encode()
    return decode_infer_body(text + binary, len(text) if binary else None, "m", version, CONTRACT)


def _inputs(x: object, ids: object = [[7]]) -> dict[str, object]:
    return {
        "inputs": [
            {"name": "x", "shape": [1, 2], "datatype": "FP32", "data": x},
            {"name": "ids", "shape": [1, 1], "datatype": "INT64", "data": ids},
        ]
    }


def test_json_data_nested_or_flat_decodes_to_the_same_arrays() -> None:
    nested = _decode(_inputs([[1.5, 2]])).request
    flat = _decode(_inputs([1.5, 2], [7])).request
    for a, b in zip(nested.inputs, flat.inputs, strict=True):
        assert a.data.tobytes() == b.data.tobytes()
    assert nested.inputs[0].data.dtype == np.float32
    assert nested.inputs[0].data.tolist() == [[1.5, 2.0]]
    assert nested.model_name == "m"


def test_binary_inputs_follow_the_json_header_in_order() -> None:
    x = np.array([[1, 2]], np.float32)
    ids = np.array([[9]], np.int64)
    header = {
        "id": "abc",
        "inputs": [
            {"name": "x", "shape": [1, 2], "datatype": "FP32", "parameters": {"binary_data_size": 8}},
            {"name": "ids", "shape": [1, 1], "datatype": "INT64", "parameters": {"binary_data_size": 8}},
        ],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}, {"name": "s"}],
    }
    decoded = _decode(header, x.tobytes() + ids.tobytes(), version="3")
    assert decoded.request.id == "abc"
    assert decoded.request.model_version == "3"
    assert decoded.request.inputs[1].data.tolist() == [[9]]
    assert decoded.request.requested_outputs == ("y", "s")
    assert decoded.binary_outputs("y") is True
    assert decoded.binary_outputs("s") is False


@pytest.mark.parametrize(
    ("header", "binary", "message"),
    [
        (_inputs([[1, 2, 3]]), b"", "'data' holds 3 elements, FP32[1, 2] needs 2"),
        (_inputs([[1, "a"]]), b"", "not FP32 values"),
        (_inputs([[1, 2]], [[2**63]]), b"", "outside the INT64 range"),
        (_inputs([[1, 2]], [[1.5]]), b"", "not INT64 values"),
        (_inputs([[1, 2]], [[True]]), b"", "not INT64 values"),
        (_inputs([[1], [2, 3]]), b"", "ragged"),
        ({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32"}]}, b"", "no 'data'"),
        ({"inputs": [{"name": "x", "shape": ["1"], "datatype": "FP32", "data": []}]}, b"", "list of integers"),
        ({"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32", "data": []}]}, b"", "outside 0..2^62"),
        ({"inputs": [{"name": "x", "shape": [1], "datatype": "FP99", "data": [1]}]}, b"", "unknown datatype 'FP99'"),
        ({"inputs": "x"}, b"", "'inputs' must be list"),
        ({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]},
         b"\0" * 8, "runs past the 8 binary bytes"),
        ({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "parameters": {"binary_data_size": 4}}]},
         b"\0" * 8, "add up to 4"),
        ({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "parameters": {"binary_data_size": 4}},
                     {"name": "ids", "shape": [1, 1], "datatype": "INT64", "parameters": {"binary_data_size": 8}}]},
         b"\0" * 12, "raw contents hold 4 bytes, but FP32[1, 2] needs 8"),
        ({**_inputs([[1, 2]]), "outputs": [{"name": "zz"}]}, b"", "unknown requested output 'zz'"),
        ({"inputs": [{"name": f"t{i}", "shape": [1], "datatype": "FP32", "data": [1]} for i in range(9)]}, b"",
         "the model takes 2 input(s)"),
        ({**_inputs([[1, 2]]), "inputs": [_inputs([[1, 2]])["inputs"][0]] * 2}, b"", "appears more than once"),
        ({"inputs": [{"name": "x", "shape": [5, 2], "datatype": "FP32", "data": [0] * 10},
                     {"name": "ids", "shape": [5, 1], "datatype": "INT64", "data": [0] * 5}]}, b"", "outside 1..4"),
    ],
)  # fmt: skip
def test_bad_bodies_are_invalid_input_naming_the_problem(
    header: dict[str, object], binary: bytes, message: str
) -> None:
    with pytest.raises(InvalidInput, match=re.escape(message)):
        _decode(header, binary)


def test_deeply_nested_json_is_invalid_input_not_a_crash() -> None:
    with pytest.raises(InvalidInput, match="not valid JSON"):
        decode_infer_body(b"[" * 20_000, None, "m", "", CONTRACT)


def test_json_is_bounded_before_it_is_parsed() -> None:
    """2M empty lists (6 MB) took 6 s of event loop and 150 MB to parse on a loaded 2-core machine."""
    import time

    started = time.perf_counter()
    with pytest.raises(InvalidInput, match="arrays and objects, more than 65536; send 'data' flat"):
        decode_infer_body(b"[" + b"[]," * 2_000_000 + b"[]]", None, "m", "", CONTRACT)
    with pytest.raises(InvalidInput, match="send large tensors as binary data"):
        decode_infer_body(b" " * (MAX_JSON_BYTES + 1), None, "m", "", CONTRACT)
    assert time.perf_counter() - started < 0.5


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("12", 12), ("0", 0), (" 7 ", 7), ("012", 12), (None, None),
        ("13", "invalid"), ("-1", "invalid"), ("x", "invalid"), ("", "invalid"), ("\u00b2", "invalid"),
        ("1" * 4301, "invalid"),  # int() itself refuses 4,301 digits (ValueError): a 500 before
    ],
)  # fmt: skip
def test_header_length_must_lie_within_the_body(value: str | None, ok: object) -> None:
    if ok == "invalid":
        with pytest.raises(InvalidInput, match="Inference-Header-Content-Length"):
            parse_header_length(value, 12)
    else:
        assert parse_header_length(value, 12) == ok


def test_outputs_encode_as_json_or_binary_after_the_header() -> None:
    y = Tensor("y", Datatype.FP32, np.array([[0.5], [1.5]], np.float32))
    s = Tensor("s", Datatype.BYTES, np.array([b"a", b"bc"], dtype=object))
    response = InferResponse("m", "1", "id-1", (y, s))

    as_json = encode_infer_body(response, lambda name: False)
    assert as_json.header_length is None
    assert as_json.content_type == "application/json"
    assert json.loads(as_json.body) == {
        "model_name": "m",
        "model_version": "1",
        "id": "id-1",
        "outputs": [
            {"name": "y", "datatype": "FP32", "shape": [2, 1], "data": [0.5, 1.5]},
            {"name": "s", "datatype": "BYTES", "shape": [2], "data": ["a", "bc"]},
        ],
    }

    mixed = encode_infer_body(response, lambda name: name == "y")
    assert mixed.content_type == "application/octet-stream"
    head = json.loads(mixed.body[: mixed.header_length])
    assert head["outputs"][0] == {
        "name": "y",
        "datatype": "FP32",
        "shape": [2, 1],
        "parameters": {"binary_data_size": 8},
    }
    assert mixed.body[mixed.header_length :] == encode_tensor_bytes(y)


def test_non_utf8_bytes_outputs_must_be_asked_for_as_binary() -> None:
    s = Tensor("s", Datatype.BYTES, np.array([b"\xff"], dtype=object))
    with pytest.raises(InvalidInput, match="binary_data true"):
        encode_infer_body(InferResponse("m", "1", "", (s,)), lambda name: False)


def test_the_model_config_body_is_the_built_configuration_as_json() -> None:
    signature = ModelSignature((TensorSpec("x", Datatype.FP32, (-1, 4)),), (TensorSpec("y", Datatype.INT64, (2,)),))
    body = model_config_body(model_config("m", "paddle_inference", signature, max_batch_size=8))
    assert json.loads(json.dumps(body)) == {
        "name": "m",
        "platform": "paddle_inference",
        "backend": "paddle",
        "max_batch_size": 0,  # the output has no batch dimension
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1, 4]}],
        "output": [{"name": "y", "data_type": "TYPE_INT64", "dims": [2]}],
    }
