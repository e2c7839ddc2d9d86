"""TF Serving's own generated stubs (tensorflow-serving-api) as a client: Predict, GetModelMetadata and
GetModelStatus against TARGET for the two_io model; prints what it got as JSON. Run by test_tfserving_stubs.py in
a process of its own with tensorflow-protobuf's generated TensorFlow messages on PYTHONPATH (no TensorFlow runtime;
Skiff's modules are never imported here, so the default descriptor pool holds TensorFlow's own files)."""

from __future__ import annotations

import json
import sys

import grpc
import numpy as np
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)


def _tensor(array: np.ndarray, dtype: int) -> tensor_pb2.TensorProto:
    shape = tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in array.shape])
    return tensor_pb2.TensorProto(dtype=dtype, tensor_shape=shape, tensor_content=array.tobytes())


def main(target: str, features: list[list[float]], ids: list[list[int]]) -> None:
    with grpc.insecure_channel(target) as channel:
        predict = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "two_io"
        request.model_spec.signature_name = "serving_default"
        request.inputs["features"].CopyFrom(_tensor(np.array(features, np.float32), types_pb2.DT_FLOAT))
        request.inputs["ids"].CopyFrom(_tensor(np.array(ids, np.int64), types_pb2.DT_INT64))
        reply = predict.Predict(request, timeout=30)
        outputs = {
            name: {"dtype": types_pb2.DataType.Name(t.dtype), "shape": [d.size for d in t.tensor_shape.dim],
                   "content": t.tensor_content.hex()}
            for name, t in reply.outputs.items()
        }  # fmt: skip
        metadata_request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        metadata_request.model_spec.name = "two_io"
        metadata = predict.GetModelMetadata(metadata_request, timeout=30)
        signatures = get_model_metadata_pb2.SignatureDefMap()
        assert metadata.metadata["signature_def"].Unpack(signatures)
        serving = signatures.signature_def["serving_default"]
        status_request = get_model_status_pb2.GetModelStatusRequest()
        status_request.model_spec.name = "two_io"
        status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(status_request, timeout=30)
        missing = predict_pb2.PredictRequest()
        missing.CopyFrom(request)
        missing.model_spec.version.value = 99
        try:
            predict.Predict(missing, timeout=30)
            missing_code = "OK"
        except grpc.RpcError as error:
            missing_code = error.code().name
    json.dump(
        {
            "outputs": outputs,
            "model_spec": {"name": reply.model_spec.name, "version": reply.model_spec.version.value},
            "signature_inputs": sorted(serving.inputs),
            "signature_outputs": sorted(serving.outputs),
            "method_name": serving.method_name,
            "status": [(s.version, get_model_status_pb2.ModelVersionStatus.State.Name(s.state)) for s in
                       status.model_version_status],
            "missing_version": missing_code,
            "modules": [predict_pb2.__file__, tensor_pb2.__file__],
        },
        sys.stdout,
    )  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]))
