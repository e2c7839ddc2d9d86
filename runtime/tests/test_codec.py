"""Wire <-> domain: decoding raw and typed contents, raw-only responses, round trips, and malformed requests."""

from __future__ import annotations

import struct
import time
import tracemalloc
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from bench.hostile import HOSTILE, good_request, head, length_delimited, tag

from skiff_runtime.codec import (
    MAX_HEAD_BYTES,
    decode_request,
    decode_request_bytes,
    decode_response,
    encode_model_config,
    encode_request,
    encode_response,
    encode_response_bytes,
)
from skiff_runtime.errors import InvalidInput
from skiff_runtime.model_config import model_config
from skiff_runtime.proto import inference_pb2 as pb
from skiff_runtime.tensors import (
    NUMPY_DTYPES,
    Datatype,
    InferRequest,
    InferResponse,
    ModelSignature,
    Tensor,
    TensorHead,
    TensorSpec,
)
from skiff_runtime.validation import ModelContract

# Values that probe each datatype's extremes, shaped (2, 3).
SAMPLES: dict[Datatype, list[object]] = {
    Datatype.BOOL: [True, False, True, False, False, True],
    Datatype.UINT8: [0, 1, 2, 127, 128, 255],
    Datatype.UINT16: [0, 1, 2, 3, 32768, 65535],
    Datatype.UINT32: [0, 1, 2, 3, 2**31, 2**32 - 1],
    Datatype.UINT64: [0, 1, 2, 3, 2**63, 2**64 - 1],
    Datatype.INT8: [-128, -1, 0, 1, 2, 127],
    Datatype.INT16: [-(2**15), -1, 0, 1, 2, 2**15 - 1],
    Datatype.INT32: [-(2**31), -1, 0, 1, 2, 2**31 - 1],
    Datatype.INT64: [-(2**63), -1, 0, 1, 2, 2**63 - 1],
    Datatype.FP16: [0.0, -1.5, 2.0, 65504.0, float("inf"), -0.25],
    Datatype.FP32: [0.0, -1.5, 2.0, 3.25e38, float("inf"), 1e-40],
    Datatype.FP64: [0.0, -1.5, 2.0, 1.7e308, float("-inf"), 5e-324],
    Datatype.BF16: [0x0000, 0x3F80, 0xBF80, 0x7F80, 0x4049, 0x0001],  # bit patterns: 0, 1, -1, inf, ~3.14
}
BYTES_SAMPLE = [b"", b"a", b"\x00\xff", "h\u00e9".encode(), b"x" * 300, b"end"]

# Which InferTensorContents field carries each datatype, written out independently of the codec's table.
TYPED_FIELDS = {
    Datatype.BOOL: "bool_contents",
    Datatype.UINT8: "uint_contents",
    Datatype.UINT16: "uint_contents",
    Datatype.UINT32: "uint_contents",
    Datatype.UINT64: "uint64_contents",
    Datatype.INT8: "int_contents",
    Datatype.INT16: "int_contents",
    Datatype.INT32: "int_contents",
    Datatype.INT64: "int64_contents",
    Datatype.FP32: "fp32_contents",
    Datatype.FP64: "fp64_contents",
}


def sample_array(datatype: Datatype) -> np.ndarray:
    if datatype is Datatype.BYTES:
        array = np.empty(len(BYTES_SAMPLE), dtype=object)
        array[:] = BYTES_SAMPLE
        return array.reshape(2, 3)
    return np.array(SAMPLES[datatype], dtype=NUMPY_DTYPES[datatype]).reshape(2, 3)


def length_prefixed(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def raw_request(*tensors: tuple[str, str, list[int], bytes]) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m")
    for name, datatype, shape, raw in tensors:
        message.inputs.add(name=name, datatype=datatype, shape=shape)
        message.raw_input_contents.append(raw)
    return message


def typed_request(name: str, datatype: str, shape: list[int], **contents: list[object]) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name=name, datatype=datatype, shape=shape, contents=pb.InferTensorContents(**contents))
    return message


def assert_same_array(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    assert got.dtype == want.dtype
    if want.dtype.kind == "f":
        np.testing.assert_array_equal(got, want)
    else:
        assert got.tolist() == want.tolist()


# ---- decoding valid requests ----


@pytest.mark.parametrize("datatype", sorted(SAMPLES), ids=str)
def test_decode_raw_contents_of_every_fixed_size_datatype(datatype: Datatype) -> None:
    want = sample_array(datatype)
    message = raw_request(("x", datatype.value, [2, 3], want.astype(want.dtype.newbyteorder("<")).tobytes()))
    request = decode_request(message)
    (tensor,) = request.inputs
    assert tensor.name == "x"
    assert tensor.datatype is datatype
    assert_same_array(tensor.data, want)


def test_decode_raw_contents_are_little_endian() -> None:
    message = raw_request(("x", "INT32", [2], b"\x01\x00\x00\x00\x00\x01\x00\x00"))
    assert decode_request(message).inputs[0].data.tolist() == [1, 256]


@pytest.mark.parametrize("datatype", sorted(TYPED_FIELDS), ids=str)
def test_decode_typed_contents_of_every_datatype(datatype: Datatype) -> None:
    want = sample_array(datatype)
    message = typed_request("x", datatype.value, [2, 3], **{TYPED_FIELDS[datatype]: SAMPLES[datatype]})
    (tensor,) = decode_request(message).inputs
    assert tensor.datatype is datatype
    assert_same_array(tensor.data, want)


@pytest.mark.parametrize(("datatype", "field"), [("FP16", "fp32_contents"), ("BF16", "uint_contents")])
def test_fp16_and_bf16_typed_contents_are_rejected(datatype: str, field: str) -> None:
    message = typed_request("h", datatype, [1], **{field: [1]})
    with pytest.raises(InvalidInput, match=rf"input 'h': {datatype} travels only as raw_input_contents"):
        decode_request(message)


def test_decode_bytes_raw_contents_are_length_prefixed() -> None:
    message = raw_request(("s", "BYTES", [2, 3], length_prefixed(*BYTES_SAMPLE)))
    (tensor,) = decode_request(message).inputs
    assert tensor.datatype is Datatype.BYTES
    assert tensor.data.dtype == object
    assert tensor.data.shape == (2, 3)
    assert tensor.data.reshape(-1).tolist() == BYTES_SAMPLE


def test_decode_bytes_typed_contents() -> None:
    message = typed_request("s", "BYTES", [3, 2], bytes_contents=BYTES_SAMPLE)
    (tensor,) = decode_request(message).inputs
    assert tensor.data.shape == (3, 2)
    assert tensor.data.reshape(-1).tolist() == BYTES_SAMPLE


def test_decode_empty_tensors() -> None:
    message = raw_request(("x", "FP32", [0, 4], b""), ("s", "BYTES", [0], b""))
    x, s = decode_request(message).inputs
    assert x.data.shape == (0, 4)
    assert s.data.shape == (0,)


def test_decode_keeps_ids_parameters_and_requested_outputs() -> None:
    message = raw_request(("x", "INT64", [1], struct.pack("<q", 7)))
    message.model_version = "3"
    message.id = "req-1"
    message.parameters["priority"].uint64_param = 2
    message.parameters["timeout"].int64_param = 1500
    message.parameters["flag"].bool_param = True
    message.parameters["tag"].string_param = "t"
    message.parameters["ratio"].double_param = 0.5
    message.outputs.add(name="b")
    message.outputs.add(name="a")
    request = decode_request(message)
    assert (request.model_name, request.model_version, request.id) == ("m", "3", "req-1")
    assert request.requested_outputs == ("b", "a")
    assert request.parameters == {"priority": 2, "timeout": 1500, "flag": True, "tag": "t", "ratio": 0.5}


# ---- encoding responses ----


def test_encode_response_uses_only_raw_output_contents_in_output_order() -> None:
    outputs = (
        Tensor("z", Datatype.FP32, np.array([[1.0, 2.0]], dtype=np.float32)),
        Tensor("a", Datatype.INT64, np.array([3], dtype=np.int64)),
        Tensor("s", Datatype.BYTES, np.array([b"hi", b""], dtype=object)),
    )
    message = encode_response(InferResponse("m", "1", "req", outputs))
    assert (message.model_name, message.model_version, message.id) == ("m", "1", "req")
    assert [o.name for o in message.outputs] == ["z", "a", "s"]
    assert [o.datatype for o in message.outputs] == ["FP32", "INT64", "BYTES"]
    assert [list(o.shape) for o in message.outputs] == [[1, 2], [1], [2]]
    assert not any(o.HasField("contents") for o in message.outputs)
    assert list(message.raw_output_contents) == [
        struct.pack("<2f", 1.0, 2.0),
        struct.pack("<q", 3),
        length_prefixed(b"hi", b""),
    ]


def test_encode_response_writes_little_endian_row_major_bytes() -> None:
    big_endian = np.arange(6, dtype=">i4").reshape(2, 3)
    transposed = np.arange(6, dtype=np.int16).reshape(2, 3).T  # not C-contiguous
    outputs = (Tensor("b", Datatype.INT32, big_endian), Tensor("t", Datatype.INT16, transposed))
    message = encode_response(InferResponse("m", "1", "", outputs))
    assert message.raw_output_contents[0] == struct.pack("<6i", 0, 1, 2, 3, 4, 5)
    assert message.raw_output_contents[1] == struct.pack("<6h", 0, 3, 1, 4, 2, 5)
    assert list(message.outputs[1].shape) == [3, 2]


@pytest.mark.parametrize(
    "outputs",
    [
        (),
        (Tensor("y", Datatype.FP32, np.zeros((0, 3), dtype=np.float32)),),
        (Tensor("scalar", Datatype.FP64, np.array(2.5)),),
        (Tensor("big", Datatype.FP32, np.arange(21 * 224 * 224, dtype=np.float32).reshape(1, 21, 224, 224)),),
        (Tensor("b", Datatype.INT32, np.arange(6, dtype=">i4").reshape(2, 3)),),
        (Tensor("t", Datatype.INT16, np.arange(6, dtype=np.int16).reshape(2, 3).T),),
        (Tensor("sliced", Datatype.FP32, np.arange(12, dtype=np.float32).reshape(4, 3)[1:3]),),
        (
            Tensor("s", Datatype.BYTES, np.array([b"hi", b""], dtype=object)),
            Tensor("\u00e9", Datatype.BOOL, np.ones(3, bool)),
        ),
    ],
    ids=["none", "empty", "0-d", "4-MiB", "big-endian", "transposed", "batch-slice", "bytes-and-bool"],
)
def test_serialized_response_is_byte_for_byte_what_protobuf_writes(outputs: tuple[Tensor, ...]) -> None:
    response = InferResponse("model-\u00e9", "12", "request-id", outputs)
    assert encode_response_bytes(response) == encode_response(response).SerializeToString()


def test_encode_bytes_accepts_str_elements_as_utf8() -> None:
    outputs = (Tensor("s", Datatype.BYTES, np.array(["h\u00e9", "x"])),)
    message = encode_response(InferResponse("m", "1", "", outputs))
    assert message.raw_output_contents[0] == length_prefixed("h\u00e9".encode(), b"x")


def test_encode_bytes_rejects_other_elements() -> None:
    outputs = (Tensor("s", Datatype.BYTES, np.array([1, 2], dtype=object)),)
    with pytest.raises(InvalidInput, match="a BYTES element is a int, not bytes or str"):
        encode_response(InferResponse("m", "1", "", outputs))


# ---- round trips over the wire ----


def _parse_then_decode(data: bytes) -> InferRequest:
    return decode_request(pb.ModelInferRequest.FromString(data))


# The server decodes the bytes directly (tensors viewed in place); both paths must agree.
DECODERS = {"protobuf-parse": _parse_then_decode, "split-bytes": decode_request_bytes}


@pytest.mark.parametrize("decode", DECODERS.values(), ids=list(DECODERS))
@pytest.mark.parametrize("datatype", list(Datatype), ids=str)
def test_request_round_trips_through_the_wire(datatype: Datatype, decode: Callable[[bytes], InferRequest]) -> None:
    want = sample_array(datatype)
    message = encode_request(
        "m", [Tensor("x", datatype, want)], model_version="2", request_id="r", requested_outputs=["y"]
    )
    assert not message.inputs[0].HasField("contents")
    request = decode(message.SerializeToString())
    assert (request.model_name, request.model_version, request.id) == ("m", "2", "r")
    assert request.requested_outputs == ("y",)
    (tensor,) = request.inputs
    assert tensor.datatype is datatype
    assert_same_array(tensor.data, want)


# The server writes the serialized response itself (each output copied once); both paths must give the same bytes.
ENCODERS = {
    "protobuf-serialize": lambda response: encode_response(response).SerializeToString(),
    "join-bytes": encode_response_bytes,
}


@pytest.mark.parametrize("encode", ENCODERS.values(), ids=list(ENCODERS))
@pytest.mark.parametrize("datatype", list(Datatype), ids=str)
def test_response_round_trips_through_the_wire(datatype: Datatype, encode: Callable[[InferResponse], bytes]) -> None:
    want = sample_array(datatype)
    other = np.array([1.5], dtype=np.float32)
    outputs = (Tensor("y", datatype, want), Tensor("other", Datatype.FP32, other))
    decoded = decode_response(pb.ModelInferResponse.FromString(encode(InferResponse("m", "1", "r", outputs))))
    assert list(decoded) == ["y", "other"]
    assert_same_array(decoded["y"], want)
    assert_same_array(decoded["other"], other)


def test_decode_response_rejects_missing_raw_contents() -> None:
    message = pb.ModelInferResponse()
    message.outputs.add(name="y", datatype="FP32", shape=[1])
    with pytest.raises(InvalidInput, match="1 outputs but 0 raw contents"):
        decode_response(message)


def test_decode_response_rejects_negative_dimensions() -> None:
    message = pb.ModelInferResponse()
    message.outputs.add(name="y", datatype="FP32", shape=[-2, -2])
    message.raw_output_contents.append(bytes(16))
    with pytest.raises(InvalidInput, match=r"'y': shape \[-2, -2\] has a negative dimension"):
        decode_response(message)


# ---- malformed requests ----


def _mixed_raw_and_typed() -> pb.ModelInferRequest:
    message = raw_request(("x", "FP32", [1], bytes(4)), ("y", "FP32", [1], bytes(4)))
    message.inputs[1].contents.fp32_contents.append(1.0)
    return message


def _duplicated_outputs() -> pb.ModelInferRequest:
    message = raw_request(("x", "FP32", [1], bytes(4)))
    message.outputs.add(name="y")
    message.outputs.add(name="y")
    return message


def _parameter_without_value() -> pb.ModelInferRequest:
    message = raw_request(("x", "FP32", [1], bytes(4)))
    message.parameters["priority"].CopyFrom(pb.InferParameter())
    return message


def _raw_without_inputs() -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m")
    message.raw_input_contents.append(bytes(4))
    return message


def _no_data() -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="x", datatype="FP32", shape=[1])
    return message


def _raw_count_mismatch() -> pb.ModelInferRequest:
    message = raw_request(("x", "FP32", [1], bytes(4)))
    message.inputs.add(name="y", datatype="FP32", shape=[1])
    return message


MALFORMED: list[tuple[str, Callable[[], pb.ModelInferRequest], list[str]]] = [
    (
        "wrong-byte-count",
        lambda: raw_request(("x", "FP32", [2, 2], bytes(12))),
        ["'x'", "hold 12 bytes", "FP32[2, 2] needs 16", "4 elements x 4 bytes"],
    ),
    (
        "wrong-byte-count-fp16",
        lambda: raw_request(("h", "FP16", [3], bytes(12))),
        ["'h'", "hold 12 bytes", "FP16[3] needs 6"],
    ),
    ("mixed-raw-and-typed", _mixed_raw_and_typed, ["'y'", "typed contents", "raw_input_contents"]),
    ("raw-count-mismatch", _raw_count_mismatch, ["1 entries for 2 inputs", "every input needs one"]),
    ("raw-without-inputs", _raw_without_inputs, ["1 entries for 0 inputs"]),
    ("missing-data", _no_data, ["'x'", "no data", "contents", "raw_input_contents"]),
    (
        "negative-dim",
        lambda: raw_request(("x", "FP32", [-1, 4], bytes(16))),
        ["'x'", "[-1, 4]", "negative dimension"],
    ),
    ("rank-17", lambda: raw_request(("x", "FP32", [1] * 17, bytes(4))), ["'x'", "rank 17", "limit of 16"]),
    (
        "shape-overflows-with-zero-dim",
        lambda: raw_request(("x", "FP32", [0, 2**62, 2**62], b"")),
        ["'x'", f"[0, {2**62}, {2**62}]", "larger than any tensor"],
    ),
    (
        "duplicate-input",
        lambda: raw_request(("x", "FP32", [1], bytes(4)), ("x", "FP32", [1], bytes(4))),
        ["'x'", "more than once"],
    ),
    (
        "unknown-datatype",
        lambda: raw_request(("x", "FLOAT32", [1], bytes(4))),
        ["'x'", "'FLOAT32'", "expected one of", "FP32", "BYTES"],
    ),
    (
        "typed-in-wrong-field",
        lambda: typed_request("x", "FP32", [2], int_contents=[1, 2]),
        ["'x'", "FP32 data must be in fp32_contents", "got int_contents"],
    ),
    (
        "typed-in-extra-field",
        lambda: typed_request("x", "INT64", [1], int64_contents=[1], fp64_contents=[1.0]),
        ["'x'", "int64_contents", "got fp64_contents"],
    ),
    (
        "typed-count-mismatch",
        lambda: typed_request("x", "FP32", [2, 2], fp32_contents=[1.0, 2.0, 3.0]),
        ["'x'", "fp32_contents holds 3 elements", "FP32[2, 2] needs 4"],
    ),
    (
        "int8-out-of-range",
        lambda: typed_request("x", "INT8", [3], int_contents=[1, 200, -1]),
        ["'x'", "holds 200", "INT8", "-128..127"],
    ),
    (
        "int16-out-of-range",
        lambda: typed_request("x", "INT16", [2], int_contents=[-40000, 0]),
        ["'x'", "holds -40000", "INT16", "-32768..32767"],
    ),
    (
        "uint8-out-of-range",
        lambda: typed_request("x", "UINT8", [2], uint_contents=[255, 256]),
        ["'x'", "holds 256", "UINT8", "0..255"],
    ),
    (
        "fp16-typed",
        lambda: typed_request("h", "FP16", [1], fp32_contents=[1.0]),
        ["'h'", "FP16 travels only as raw_input_contents"],
    ),
    (
        "bytes-truncated-length-prefix",
        lambda: raw_request(("s", "BYTES", [2], length_prefixed(b"ab") + b"\x01\x00")),
        ["'s'", "element 1", "truncated length prefix"],
    ),
    (
        "bytes-element-overrun",
        lambda: raw_request(("s", "BYTES", [1], struct.pack("<I", 10) + b"abc")),
        ["'s'", "element 0", "declares 10 bytes", "only 3 remain"],
    ),
    (
        "bytes-too-many-elements",
        lambda: raw_request(("s", "BYTES", [1], length_prefixed(b"a", b"b"))),
        ["'s'", "more than the 1 elements"],
    ),
    (
        "bytes-too-few-elements",
        lambda: raw_request(("s", "BYTES", [3], length_prefixed(b"a", b"b"))),
        ["'s'", "hold 2 elements", "shape needs 3"],
    ),
    (
        "bytes-typed-count-mismatch",
        lambda: typed_request("s", "BYTES", [3], bytes_contents=[b"a"]),
        ["'s'", "bytes_contents holds 1 elements", "BYTES[3] needs 3"],
    ),
    ("duplicated-requested-outputs", _duplicated_outputs, ["requested outputs repeat a name", "['y', 'y']"]),
    ("parameter-without-value", _parameter_without_value, ["parameter 'priority'", "no value"]),
]


@pytest.mark.parametrize(("build", "fragments"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_request_is_invalid_input(build: Callable[[], pb.ModelInferRequest], fragments: list[str]) -> None:
    with pytest.raises(InvalidInput) as info:
        decode_request(build())
    for fragment in fragments:
        assert fragment in str(info.value)
    with pytest.raises(InvalidInput) as from_bytes:
        decode_request_bytes(build().SerializeToString())
    assert str(from_bytes.value) == str(info.value)


# ---- the wire-level split (tensors kept out of the protobuf parse) ----


def test_split_bytes_views_the_tensors_in_place() -> None:
    image = np.arange(12, dtype=np.float32).reshape(1, 3, 4)
    data = bytearray(raw_request(("x", "FP32", [1, 3, 4], image.tobytes())).SerializeToString())
    (tensor,) = decode_request_bytes(data).inputs
    assert_same_array(tensor.data, image)
    offset = bytes(data).index(image.tobytes())
    data[offset : offset + 4] = np.float32(42).tobytes()  # the decoded array is a view: it sees the change
    assert tensor.data[0, 0, 0] == 42


def test_split_bytes_keeps_raw_contents_in_wire_order_across_interleaved_fields() -> None:
    # Concatenated messages merge (protobuf rule), so this stream interleaves inputs and raw contents.
    first = raw_request(("a", "INT32", [2], np.array([1, 2], np.int32).tobytes()))
    second = pb.ModelInferRequest(id="r2")
    second.inputs.add(name="b", datatype="INT32", shape=[1])
    second.raw_input_contents.append(np.array([3], np.int32).tobytes())
    request = decode_request_bytes(first.SerializeToString() + second.SerializeToString())
    assert [(t.name, t.data.tolist()) for t in request.inputs] == [("a", [1, 2]), ("b", [3])]
    assert (request.model_name, request.id) == ("m", "r2")


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"\x80", "ends inside a varint"),
        (b"\x08" + b"\xff" * 10 + b"\x01", "longer than 10 bytes"),
        (b"\x3a\x05ab", "field 7 declares 5 bytes, 2 remain"),
        (b"\x0b", "wire type 3 in field 1"),
        (b"\x00\x00", "field number 0"),
        (b"\x09abc", "field 1 runs past the end"),
        (b"\x2a\x02\xff\xff", "malformed ModelInferRequest"),  # inputs (field 5) that do not parse
    ],
    ids=["truncated-varint", "long-varint", "short-raw", "group", "field-0", "short-fixed64", "bad-submessage"],
)
def test_malformed_wire_bytes_are_invalid_input(data: bytes, fragment: str) -> None:
    with pytest.raises(InvalidInput, match="malformed ModelInferRequest") as info:
        decode_request_bytes(data)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    "build",
    [
        lambda: raw_request(("x", "FP32", [1_000_000, 1_000_000], bytes(16))),
        lambda: typed_request("x", "FP32", [1_000_000, 1_000_000], fp32_contents=[1.0] * 4),
        lambda: raw_request(("s", "BYTES", [1_000_000, 1_000_000], length_prefixed(b"a", b"b"))),
        lambda: typed_request("s", "BYTES", [1_000_000, 1_000_000], bytes_contents=[b"a"]),
    ],
    ids=["raw", "typed", "bytes-raw", "bytes-typed"],
)
def test_huge_declared_shape_with_small_data_is_rejected_without_allocating(
    build: Callable[[], pb.ModelInferRequest],
) -> None:
    message = build()
    tracemalloc.start()
    try:
        with pytest.raises(InvalidInput, match="1000000"):
            decode_request(message)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000


# ---- hostile messages: bounded work and memory before anything is expanded ----

TWO_IO = ModelSignature(
    inputs=(TensorSpec("features", Datatype.FP32, (-1, 4)), TensorSpec("ids", Datatype.INT64, (-1, 2))),
    outputs=(TensorSpec("fetch_name_0", Datatype.FP32, (-1, 3)), TensorSpec("fetch_name_1", Datatype.INT64, (-1,))),
)
CONTRACT = ModelContract(TWO_IO, 8)
HOSTILE_BYTES = 4 << 20


@pytest.mark.parametrize("name", sorted(HOSTILE), ids=str)
def test_hostile_message_is_refused_in_bounded_time_and_memory(name: str) -> None:
    message = HOSTILE[name](HOSTILE_BYTES)
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(InvalidInput) as info:
            decode_request_bytes(message, CONTRACT)
        seconds = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seconds < 1.0, f"{name}: {seconds:.2f} s"  # under 0.1 ms on a quiet core; before: up to 9 s at this size
    # Nothing of the message is copied: at most the request's head (names, shapes, parameters), whatever its size.
    assert peak < MAX_HEAD_BYTES, f"{name}: peak {peak / 2**20:.1f} MiB for {len(message) / 2**20:.1f} MiB"
    assert len(str(info.value)) < 400


def test_a_head_larger_than_its_cap_is_refused_before_it_is_copied_and_one_under_it_decodes() -> None:
    def with_parameter(value_bytes: int) -> bytes:
        message = pb.ModelInferRequest()
        message.parameters["note"].string_param = "x" * value_bytes
        return bytes(good_request()) + message.SerializeToString()

    assert decode_request_bytes(with_parameter(MAX_HEAD_BYTES - 1024), CONTRACT).parameters["note"] == "x" * (
        MAX_HEAD_BYTES - 1024
    )
    too_large = with_parameter(8 * MAX_HEAD_BYTES)
    tracemalloc.start()
    try:
        with pytest.raises(InvalidInput, match="besides its tensor data; send tensors in raw_input_contents"):
            decode_request_bytes(too_large, CONTRACT)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MAX_HEAD_BYTES // 8


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (bytes(good_request()) + length_delimited(7, b"") * 100, "more than 6 raw_input_contents entries"),
        (bytes(good_request()) + length_delimited(5, b"") * 100, "more than 6 inputs entries"),
        (bytes(good_request()) + length_delimited(6, b"") * 100, "more than 6 outputs entries"),
        (bytes(good_request()) + b"\x78\x00" * 1000, "has more than"),
        (bytes(good_request()) + b"\x0a\x00" * 10, "more than 4 model_name entries"),
    ],
    ids=["raw", "inputs", "outputs", "unknown", "repeated-scalar"],
)
def test_field_counts_are_bounded_by_the_signature(data: bytes, fragment: str) -> None:
    with pytest.raises(InvalidInput) as info:
        decode_request_bytes(data, CONTRACT)
    assert fragment in str(info.value)
    assert "the model takes 2 input(s) and has 2 output(s)" in str(info.value) or fragment == "has more than"


def test_a_good_request_decodes_against_the_signature_with_its_tensors_in_place() -> None:
    data = bytearray(good_request(batch=3))
    request = decode_request_bytes(data, CONTRACT)
    assert [(t.name, t.shape) for t in request.inputs] == [("features", (3, 4)), ("ids", (3, 2))]
    assert not request.inputs[0].data.flags.owndata  # a view into the message


def test_typed_contents_larger_than_the_shape_allows_are_refused_before_parsing() -> None:
    message = typed_request("features", "FP32", [1, 4], fp32_contents=[1.0] * 1000)
    message.inputs.add(
        name="ids", datatype="INT64", shape=[1, 2], contents=pb.InferTensorContents(int64_contents=[1, 2])
    )
    with pytest.raises(InvalidInput, match=r"typed contents of 4003 bytes are more than FP32\[1, 4\]"):
        decode_request_bytes(message.SerializeToString(), CONTRACT)


def test_a_packed_shape_longer_than_any_rank_is_refused_unparsed() -> None:
    data = head("m") + length_delimited(5, length_delimited(1, b"x") + length_delimited(3, b"\x01" * 1000))
    with pytest.raises(InvalidInput, match="rank exceeds the limit of 16"):
        decode_request_bytes(data)


def test_client_strings_in_errors_are_cut() -> None:
    message = raw_request(("n" * 10_000, "FP32", [1], bytes(4)))
    with pytest.raises(InvalidInput) as info:
        decode_request_bytes(message.SerializeToString(), CONTRACT)
    assert "... (10000 characters)" in str(info.value)
    assert len(str(info.value)) < 400
    with pytest.raises(InvalidInput) as datatype:
        decode_request(typed_request("x", "Q" * 5000, [1]))
    assert len(str(datatype.value)) < 600


@pytest.mark.parametrize("datatype", [Datatype.FP32, Datatype.FP64], ids=str)
def test_packed_typed_floats_are_read_off_the_wire_like_protobuf_reads_them(datatype: Datatype) -> None:
    array = sample_array(datatype)
    message = typed_request("x", datatype.value, [2, 3], **{TYPED_FIELDS[datatype]: array.reshape(-1).tolist()})
    (fast,) = decode_request_bytes(message.SerializeToString()).inputs
    (slow,) = decode_request(message).inputs
    assert_same_array(fast.data, slow.data)
    assert not fast.data.flags.owndata  # a view into the message: no per-element work
    number = 6 if datatype is Datatype.FP32 else 7
    width = 5 if datatype is Datatype.FP32 else 1
    unpacked = b"".join(tag(number, width) + value.tobytes() for value in array.reshape(-1))  # legal, rarer
    data = head("m") + length_delimited(5, b"\x0a\x01x" + length_delimited(2, datatype.value.encode())
                                        + length_delimited(3, b"\x02\x03") + length_delimited(5, unpacked))  # fmt: skip
    (other,) = decode_request_bytes(data).inputs
    assert_same_array(other.data, slow.data)


class _RecordingContract:
    """A contract that records the heads it is shown and refuses them all."""

    limits = CONTRACT.limits

    def __init__(self) -> None:
        self.seen: list[tuple[list[TensorHead], tuple[str, ...]]] = []

    def check_heads(self, inputs: Sequence[TensorHead], requested_outputs: Sequence[str]) -> None:
        self.seen.append((list(inputs), tuple(requested_outputs)))
        raise InvalidInput("refused by the contract")


def test_the_contract_sees_every_head_before_any_tensor_data_is_decoded() -> None:
    # Data that could never decode (3 bytes for FP32[2, 4]; typed contents of the wrong field): the contract's
    # answer comes first, so the data was not looked at.
    message = raw_request(("features", "FP32", [2, 4], b"abc"), ("ids", "INT64", [2, 2], b""))
    message.outputs.add(name="fetch_name_1")
    typed = typed_request("features", "FP32", [2, 4], int_contents=[1])
    for data in (message.SerializeToString(), typed.SerializeToString()):
        contract = _RecordingContract()
        with pytest.raises(InvalidInput, match="refused by the contract"):
            decode_request_bytes(data, contract)
        assert contract.seen[0][0][0] == TensorHead("features", Datatype.FP32, (2, 4))
    assert contract.seen == [([TensorHead("features", Datatype.FP32, (2, 4))], ())]
    with pytest.raises(InvalidInput, match="raw contents hold 3 bytes"):
        decode_request_bytes(message.SerializeToString())  # without a contract the data is decoded, and fails


def test_the_model_config_message_carries_the_built_configuration() -> None:
    config = model_config(
        "m",
        "paddle_inference",
        ModelSignature((TensorSpec("s", Datatype.BYTES, (-1, 1)),), (TensorSpec("y", Datatype.FP32, (-1, 3)),)),
        max_batch_size=4,
    )
    message = encode_model_config(config)
    assert (message.name, message.backend, message.max_batch_size) == ("m", "paddle", 4)
    assert [(t.name, t.data_type, list(t.dims)) for t in message.input] == [("s", pb.TYPE_STRING, [1])]
    assert [(t.name, t.data_type, list(t.dims)) for t in message.output] == [("y", pb.TYPE_FP32, [3])]
