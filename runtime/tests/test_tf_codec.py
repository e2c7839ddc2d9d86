"""TF Serving messages <-> domain, pure: TensorProto inputs (content and typed values), versions, signatures."""

from __future__ import annotations

import numpy as np
import pytest

from skiff_runtime import tf_codec
from skiff_runtime.errors import InvalidInput, ModelNotFound
from skiff_runtime.proto import tensorflow_core_pb2 as tf
from skiff_runtime.proto import tensorflow_serving_pb2 as tfs
from skiff_runtime.tensors import Datatype, InferResponse, ModelSignature, Tensor, TensorSpec
from skiff_runtime.validation import ModelContract

SIGNATURE = ModelSignature(
    inputs=(
        TensorSpec("x", Datatype.FP16, (-1, 2)),
        TensorSpec("n", Datatype.INT8, (-1, 1)),
        TensorSpec("s", Datatype.BYTES, (-1,)),
    ),
    outputs=(TensorSpec("y", Datatype.FP32, (-1, 1)),),
)
CONTRACT = ModelContract(SIGNATURE, 4)


def _proto(dtype: int, shape: list[int], **values: object) -> tf.TensorProto:
    proto = tf.TensorProto(dtype=dtype, **values)
    proto.tensor_shape.dim.extend(tf.TensorShapeProto.Dim(size=d) for d in shape)
    return proto


def _request(x: tf.TensorProto, n: tf.TensorProto | None = None, **spec: object) -> tfs.PredictRequest:
    request = tfs.PredictRequest(model_spec=tfs.ModelSpec(name="m", **spec))
    request.inputs["x"].CopyFrom(x)
    request.inputs["n"].CopyFrom(n or _proto(tf.DT_INT8, [1, 1], int_val=[-5]))
    request.inputs["s"].CopyFrom(_proto(tf.DT_STRING, [1], string_val=[b"hi"]))
    return request


def _decode(request: tfs.PredictRequest, version: str = "v2"):
    return {t.name: t.data for t in tf_codec.decode_predict(request, "m", version, CONTRACT).inputs}


def test_tensor_content_and_typed_values_decode_alike() -> None:
    x = np.array([[1.5, -2]], np.float16)
    content = _decode(_request(_proto(tf.DT_HALF, [1, 2], tensor_content=x.tobytes())))
    typed = _decode(_request(_proto(tf.DT_HALF, [1, 2], half_val=x.view(np.uint16).reshape(-1).tolist())))
    assert content["x"].tobytes() == typed["x"].tobytes() == x.tobytes()
    assert typed["n"].dtype == np.int8
    assert typed["n"].tolist() == [[-5]]
    assert typed["s"].tolist() == [b"hi"]


@pytest.mark.parametrize(
    ("version", "spec", "ok"),
    [("v2", {}, True), ("v2", {"version_label": "v2"}, True), ("2", {"version_label": "v2"}, False),
     ("v2", {"version_label": "stable"}, False), ("models-2", {}, True)],
)  # fmt: skip
def test_versions_answer_to_their_number_and_their_own_name(version: str, spec: dict[str, object], ok: bool) -> None:
    request = _request(_proto(tf.DT_HALF, [1, 2], half_val=[0, 0]), **spec)
    if ok:
        _decode(request, version)
    else:
        with pytest.raises(ModelNotFound):
            _decode(request, version)


def test_a_label_of_another_version_is_refused_with_how_to_reach_it() -> None:
    request = _request(_proto(tf.DT_HALF, [1, 2], half_val=[0, 0]), version_label="v3")
    with pytest.raises(ModelNotFound, match=r"no version label 'v3'; it serves 'v2'; to reach version 'v3', send the "
                                            r"header 'skiff-version: <version>' .* Service 'm-v3'"):  # fmt: skip
        _decode(request, "v2")


@pytest.mark.parametrize(("number", "ok"), [(2, True), (3, False), (0, False)])
def test_a_version_number_selects_the_served_version(number: int, ok: bool) -> None:
    request = _request(_proto(tf.DT_HALF, [1, 2], half_val=[0, 0]))
    request.model_spec.version.value = number
    if ok:
        _decode(request, "v2")
    else:
        with pytest.raises(ModelNotFound, match=f"has no version {number}; it serves version 'v2' \\(number 2\\)"):
            _decode(request, "v2")


@pytest.mark.parametrize(
    ("x", "n", "message"),
    [
        (_proto(tf.DT_HALF, [1, 2], half_val=[1]), None, "half_val holds 1 values, shape [1, 2] needs 2"),
        (_proto(tf.DT_HALF, [1, 2], half_val=[1, 70000]), None, "not 16-bit patterns"),
        (_proto(tf.DT_HALF, [1, 2], float_val=[1, 2]), None, "FP16 values go in half_val, got float_val"),
        (_proto(tf.DT_HALF, [1, 2], half_val=[0, 0]), _proto(tf.DT_INT8, [1, 1], int_val=[300]), "INT8 range"),
        (_proto(tf.DT_COMPLEX64, [1, 2]), None, "dtype DT_COMPLEX64 is not served"),
        (_proto(tf.DT_HALF, [1, 2], tensor_content=b"\0" * 2), None, "raw contents hold 2 bytes"),
        (_proto(tf.DT_FLOAT, [1, 2], tensor_content=b"\0" * 8), None, "expected datatype FP16, got FP32"),
        (_proto(tf.DT_HALF, [-1, 2], half_val=[0, 0]), None, "needs 0"),
        (tf.TensorProto(dtype=tf.DT_HALF, tensor_shape=tf.TensorShapeProto(unknown_rank=True)), None, "unknown_rank"),
    ],
)  # fmt: skip
def test_bad_tensors_are_invalid_input(x: tf.TensorProto, n: tf.TensorProto | None, message: str) -> None:
    with pytest.raises(InvalidInput, match=message.replace("[", r"\[")):
        _decode(_request(x, n))


def test_signature_name_is_serving_default_or_empty() -> None:
    x = _proto(tf.DT_HALF, [1, 2], half_val=[0, 0])
    _decode(_request(x, signature_name="serving_default"))
    with pytest.raises(InvalidInput, match="only 'serving_default'"):
        _decode(_request(x, signature_name="predict"))


def test_outputs_travel_as_tensor_content_or_string_val() -> None:
    y = Tensor("y", Datatype.FP32, np.array([[0.25]], np.float32))
    s = Tensor("s", Datatype.BYTES, np.array([b"a", "b"], dtype=object))
    reply = tf_codec.encode_predict(InferResponse("m", "v2", "", (y, s)))
    assert reply.model_spec.version.value == 2
    assert reply.outputs["y"].dtype == tf.DT_FLOAT
    assert np.frombuffer(reply.outputs["y"].tensor_content, "<f4").tolist() == [0.25]
    assert [d.size for d in reply.outputs["y"].tensor_shape.dim] == [1, 1]
    assert list(reply.outputs["s"].string_val) == [b"a", b"b"]


def test_every_datatype_has_a_tf_dtype_and_a_value_field() -> None:
    assert set(tf_codec.TF_DATATYPES) == set(Datatype) == set(tf_codec.VALUE_FIELDS)
    assert len(tf_codec.DATATYPES_BY_TF) == len(Datatype)


def test_model_status_maps_every_state() -> None:
    request = tfs.GetModelStatusRequest(model_spec=tfs.ModelSpec(name="m"))
    for state, expected in tf_codec.TF_STATES.items():
        (status,) = tf_codec.encode_status(request, "m", "3", state).model_version_status
        assert (status.version, status.state) == (3, expected)
    failed = tf_codec.encode_status(request, "m", "3", "FAILED", "no such file").model_version_status[0]
    assert failed.status.error_message == "no such file"


def _ld(number: int, payload: bytes) -> bytes:
    length, out = len(payload), bytearray()
    while length > 0x7F:
        out.append(length & 0x7F | 0x80)
        length >>= 7
    out.append(length)
    return bytes([number << 3 | 2]) + bytes(out) + payload


def test_a_shape_of_millions_of_empty_dims_is_refused_before_the_parse() -> None:
    """33 MB of empty TensorShapeProto.Dim entries would take ~770 MB and most of a second to parse."""
    import time

    bomb = _ld(2, _ld(1, b"x") + _ld(2, _ld(2, b"\x12\x00" * (16 << 20))))
    started = time.perf_counter()
    with pytest.raises(
        InvalidInput, match=r"tensor_shape \(rank at most 16\) of input .x. repeats field 2 more than 16 times"
    ):
        tf_codec.check_predict_bytes(bomb, CONTRACT)
    assert time.perf_counter() - started < 0.1


def test_counts_are_bounded_by_the_signature() -> None:
    many = b"".join(_ld(2, _ld(1, f"t{i}".encode()) + _ld(2, b"")) for i in range(100))
    with pytest.raises(InvalidInput, match="repeats field 2 more than 7 times"):
        tf_codec.check_predict_bytes(many, CONTRACT)
    strings = _proto(tf.DT_STRING, [4], string_val=[b"a"] * 4)
    request = _request(_proto(tf.DT_HALF, [1, 2], half_val=[0, 0]))
    request.inputs["s"].CopyFrom(strings)
    tf_codec.check_predict_bytes(request.SerializeToString(), CONTRACT)  # 4 strings: the batch limit
    strings.string_val.extend([b"b"] * 100)
    request.inputs["s"].CopyFrom(strings)
    with pytest.raises(InvalidInput, match="input 's' has more than 68 fields"):
        tf_codec.check_predict_bytes(request.SerializeToString(), CONTRACT)


def test_a_well_formed_request_passes_the_count_check() -> None:
    request = _request(_proto(tf.DT_HALF, [1, 2], half_val=[0, 0]))
    tf_codec.check_predict_bytes(request.SerializeToString(), CONTRACT)
    with pytest.raises(InvalidInput, match="runs past its end"):
        tf_codec.check_predict_bytes(request.SerializeToString()[:-3], CONTRACT)
