"""TF Serving's PredictionService and ModelService on a real runtime: answers equal OIP's for the same input,
model_spec.version and signature_name as TF Serving handles them, and clear errors."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from skiff_runtime.client import SkiffClient
from skiff_runtime.proto import tensorflow_core_pb2 as tf
from skiff_runtime.proto import tensorflow_serving_pb2 as tfs
from skiff_runtime.proto import tensorflow_serving_pb2_grpc as tfs_grpc

pytestmark = [pytest.mark.paddle, pytest.mark.server]


def _tensor(array: np.ndarray, dtype: int, typed: str | None = None) -> tf.TensorProto:
    """As tf.make_tensor_proto builds it: tensor_content, or a typed *_val field."""
    proto = tf.TensorProto(dtype=dtype)
    proto.tensor_shape.dim.extend(tf.TensorShapeProto.Dim(size=d) for d in array.shape)
    if typed is None:
        proto.tensor_content = array.tobytes()
    else:
        getattr(proto, typed).extend(array.reshape(-1).tolist())
    return proto


def _request(features: np.ndarray, ids: np.ndarray, typed: bool = False, **spec: object) -> tfs.PredictRequest:
    request = tfs.PredictRequest(model_spec=tfs.ModelSpec(name="two_io", **spec))
    request.inputs["features"].CopyFrom(_tensor(features, tf.DT_FLOAT, "float_val" if typed else None))
    request.inputs["ids"].CopyFrom(_tensor(ids, tf.DT_INT64, "int64_val" if typed else None))
    return request


def _array(proto: tf.TensorProto, dtype: str) -> np.ndarray:
    return np.frombuffer(proto.tensor_content, dtype).reshape([d.size for d in proto.tensor_shape.dim])


FEATURES = np.random.default_rng(11).standard_normal((3, 4), dtype=np.float32)
IDS = np.arange(6, dtype=np.int64).reshape(3, 2) * 1_000_000_007


@pytest.mark.parametrize("typed", [False, True], ids=["tensor_content", "typed_val"])
def test_predict_answers_equal_oip(two_io_server, typed: bool) -> None:
    with SkiffClient(two_io_server.target) as client:
        expected = client.infer("two_io", {"features": FEATURES, "ids": IDS})
    with grpc.insecure_channel(two_io_server.target) as channel:
        reply = tfs_grpc.PredictionServiceStub(channel).Predict(_request(FEATURES, IDS, typed), timeout=30)
    assert set(reply.outputs) == {"fetch_name_0", "fetch_name_1"}
    assert reply.outputs["fetch_name_0"].dtype == tf.DT_FLOAT
    assert _array(reply.outputs["fetch_name_0"], "<f4").tobytes() == expected["fetch_name_0"].tobytes()
    np.testing.assert_array_equal(_array(reply.outputs["fetch_name_1"], "<i8"), expected["fetch_name_1"])
    assert (reply.model_spec.name, reply.model_spec.version.value, reply.model_spec.signature_name) == (
        "two_io",
        1,
        "serving_default",
    )


def test_output_filter_version_and_signature_as_tf_serving(two_io_server) -> None:
    with grpc.insecure_channel(two_io_server.target) as channel:
        stub = tfs_grpc.PredictionServiceStub(channel)
        request = _request(FEATURES, IDS, signature_name="serving_default")
        request.model_spec.version.value = 1
        request.output_filter.append("fetch_name_1")
        assert set(stub.Predict(request, timeout=30).outputs) == {"fetch_name_1"}
        assert stub.Predict(_request(FEATURES, IDS, version_label="1"), timeout=30).outputs

        cases = [
            (_request(FEATURES, IDS), "version", 7, grpc.StatusCode.NOT_FOUND, "has no version 7"),
            (_request(FEATURES, IDS, signature_name="classify"), None, None, grpc.StatusCode.INVALID_ARGUMENT,
             "serving signature 'classify' not found"),
            (_request(FEATURES, IDS, version_label="canary"), None, None, grpc.StatusCode.NOT_FOUND, "'canary'"),
            (_request(FEATURES.astype(np.float64), IDS), None, None, grpc.StatusCode.INVALID_ARGUMENT,
             "raw contents hold 96 bytes"),
            (_request(FEATURES[:, :3].copy(), IDS[:, :1].copy()), None, None, grpc.StatusCode.INVALID_ARGUMENT,
             "dimension 1 must be 4"),
        ]  # fmt: skip
        for request, field, value, code, message in cases:
            if field == "version":
                request.model_spec.version.value = value
            with pytest.raises(grpc.RpcError) as error:
                stub.Predict(request, timeout=30)
            assert error.value.code() == code, error.value.details()
            assert message in error.value.details()

        wrong_dtype = _request(FEATURES, IDS)
        wrong_dtype.inputs["ids"].dtype = tf.DT_INT32
        with pytest.raises(grpc.RpcError, match="expected datatype INT64, got INT32"):
            stub.Predict(wrong_dtype, timeout=30)
        unknown = tfs.PredictRequest(model_spec=tfs.ModelSpec(name="resnet"))
        with pytest.raises(grpc.RpcError) as error:
            stub.Predict(unknown, timeout=30)
        assert error.value.code() == grpc.StatusCode.NOT_FOUND


def test_get_model_metadata_gives_the_serving_default_signature(two_io_server) -> None:
    with grpc.insecure_channel(two_io_server.target) as channel:
        stub = tfs_grpc.PredictionServiceStub(channel)
        reply = stub.GetModelMetadata(
            tfs.GetModelMetadataRequest(model_spec=tfs.ModelSpec(name="two_io"), metadata_field=["signature_def"]),
            timeout=10,
        )
        with pytest.raises(grpc.RpcError, match="metadata_field"):
            stub.GetModelMetadata(tfs.GetModelMetadataRequest(model_spec=tfs.ModelSpec(name="two_io")), timeout=10)
    assert reply.metadata["signature_def"].type_url == "type.googleapis.com/tensorflow.serving.SignatureDefMap"
    signatures = tfs.SignatureDefMap()
    assert reply.metadata["signature_def"].Unpack(signatures)
    default = signatures.signature_def["serving_default"]
    assert default.method_name == "tensorflow/serving/predict"
    assert {n: (t.dtype, [d.size for d in t.tensor_shape.dim]) for n, t in default.inputs.items()} == {
        "features": (tf.DT_FLOAT, [-1, 4]),
        "ids": (tf.DT_INT64, [-1, 2]),
    }
    assert set(default.outputs) == {"fetch_name_0", "fetch_name_1"}


def test_get_model_status_says_available(two_io_server) -> None:
    with grpc.insecure_channel(two_io_server.target) as channel:
        stub = tfs_grpc.ModelServiceStub(channel)
        reply = stub.GetModelStatus(tfs.GetModelStatusRequest(model_spec=tfs.ModelSpec(name="two_io")), timeout=10)
        (status,) = reply.model_version_status
        assert (status.version, status.state, status.status.error_code) == (1, tfs.ModelVersionStatus.AVAILABLE, 0)
        missing = tfs.GetModelStatusRequest(model_spec=tfs.ModelSpec(name="two_io"))
        missing.model_spec.version.value = 2
        with pytest.raises(grpc.RpcError) as error:
            stub.GetModelStatus(missing, timeout=10)
        assert error.value.code() == grpc.StatusCode.NOT_FOUND


def test_unserved_tf_serving_methods_are_unimplemented(two_io_server) -> None:
    with grpc.insecure_channel(two_io_server.target) as channel:
        classify = channel.unary_unary("/tensorflow.serving.PredictionService/Classify")
        with pytest.raises(grpc.RpcError) as error:
            classify(b"", timeout=10)
    assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_oversized_metadata_and_status_requests_and_shape_bombs_are_refused(two_io_server) -> None:
    with grpc.insecure_channel(two_io_server.target) as channel:
        stub = tfs_grpc.PredictionServiceStub(channel)
        huge = tfs.GetModelMetadataRequest(model_spec=tfs.ModelSpec(name="two_io"), metadata_field=[""] * 100_000)
        with pytest.raises(grpc.RpcError) as error:
            stub.GetModelMetadata(huge, timeout=10)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "takes at most 65536" in error.value.details()
        bomb = _request(FEATURES, IDS)
        bomb.inputs["features"].tensor_shape.dim.extend(tf.TensorShapeProto.Dim() for _ in range(1_000_000))
        with pytest.raises(grpc.RpcError) as error:
            stub.Predict(bomb, timeout=30)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "rank at most 16" in error.value.details()
