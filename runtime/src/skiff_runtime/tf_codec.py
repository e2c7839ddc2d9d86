"""TensorFlow Serving wire <-> domain: PredictRequest's TensorProtos into InferRequest, outputs into TensorProtos.

Each input becomes raw wire bytes (`tensor_content` as sent, or its typed `*_val` field converted with numpy in
one step) under an OIP head, and goes through `codec.decode_request` with the model's contract (validation.py): TF
Serving clients get the same checks and messages as OIP ones. Outputs always travel as `tensor_content` (`string_val`
for strings), which is what `tf.make_ndarray` reads. Model versions are numbers in TF Serving: a served version
"3" or "v3" answers to `model_spec.version` 3, and to the label "3" or "v3" (its own name).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from skiff_runtime.codec import (
    DEFAULT_LIMITS,
    MAX_RANK,
    RequestContract,
    decode_request,
    encode_bytes_elements,
    encode_tensor_bytes,
)
from skiff_runtime.errors import InvalidInput, ModelNotFound, reach_version_hint, shown
from skiff_runtime.proto import inference_pb2 as pb
from skiff_runtime.proto import tensorflow_core_pb2 as tf
from skiff_runtime.proto import tensorflow_error_pb2 as tf_error
from skiff_runtime.proto import tensorflow_serving_pb2 as tfs
from skiff_runtime.tensors import (
    NUMPY_DTYPES,
    Datatype,
    InferRequest,
    InferResponse,
    ModelSignature,
    Tensor,
    TensorSpec,
    element_count,
)
from skiff_runtime.wire import LENGTH_DELIMITED, SPARE_FIELDS, iter_fields

# The one signature a Skiff model has, under the name TF Serving gives a SavedModel's default signature.
DEFAULT_SIGNATURE = "serving_default"
PREDICT_METHOD = "tensorflow/serving/predict"
SIGNATURE_DEF_FIELD = "signature_def"

# TF DataType per OIP datatype, and the TensorProto field that carries its values when tensor_content is empty.
TF_DATATYPES: Mapping[Datatype, tf.DataType] = {
    Datatype.BOOL: tf.DT_BOOL,
    Datatype.UINT8: tf.DT_UINT8,
    Datatype.UINT16: tf.DT_UINT16,
    Datatype.UINT32: tf.DT_UINT32,
    Datatype.UINT64: tf.DT_UINT64,
    Datatype.INT8: tf.DT_INT8,
    Datatype.INT16: tf.DT_INT16,
    Datatype.INT32: tf.DT_INT32,
    Datatype.INT64: tf.DT_INT64,
    Datatype.FP16: tf.DT_HALF,
    Datatype.FP32: tf.DT_FLOAT,
    Datatype.FP64: tf.DT_DOUBLE,
    Datatype.BF16: tf.DT_BFLOAT16,
    Datatype.BYTES: tf.DT_STRING,
}
DATATYPES_BY_TF: Mapping[int, Datatype] = {tf_type: datatype for datatype, tf_type in TF_DATATYPES.items()}
VALUE_FIELDS: Mapping[Datatype, str] = {
    Datatype.BOOL: "bool_val",
    Datatype.UINT8: "int_val",
    Datatype.UINT16: "int_val",
    Datatype.UINT32: "uint32_val",
    Datatype.UINT64: "uint64_val",
    Datatype.INT8: "int_val",
    Datatype.INT16: "int_val",
    Datatype.INT32: "int_val",
    Datatype.INT64: "int64_val",
    Datatype.FP16: "half_val",  # the 16-bit patterns, one per int32
    Datatype.FP32: "float_val",
    Datatype.FP64: "double_val",
    Datatype.BF16: "half_val",
    Datatype.BYTES: "string_val",
}


def version_number(version: str) -> int | None:
    """The TF Serving version number of a served version name: "3" and "v3" are 3; other names have none."""
    match = re.fullmatch(r"v?(\d{1,18})", version)
    return int(match.group(1)) if match else None


def check_spec(spec: tfs.ModelSpec, name: str, version: str, *, signature: bool = True) -> None:
    """NOT_FOUND unless the ModelSpec names this model and (when it names one) this version; INVALID_ARGUMENT for a
    signature other than the default one."""
    if spec.name != name:
        raise ModelNotFound(f"unknown model {shown(spec.name)}; this server serves {name!r}")
    choice = spec.WhichOneof("version_choice")
    if choice == "version" and spec.version.value != version_number(version):
        raise ModelNotFound(
            f"model {name!r} has no version {spec.version.value}; it serves version {version!r}"
            + (f" (number {version_number(version)})" if version_number(version) is not None else "")
        )
    if choice == "version_label" and spec.version_label != version:
        raise ModelNotFound(
            f"model {name!r} has no version label {shown(spec.version_label)}; it serves {version!r}; "
            + reach_version_hint(name, spec.version_label)
        )
    if signature and spec.signature_name not in ("", DEFAULT_SIGNATURE):
        raise InvalidInput(
            f"serving signature {shown(spec.signature_name)} not found; this model has only {DEFAULT_SIGNATURE!r}"
        )


def served_spec(name: str, version: str) -> tfs.ModelSpec:
    """The ModelSpec a response carries: the model, its version number (when it has one) and the signature."""
    spec = tfs.ModelSpec(name=name, signature_name=DEFAULT_SIGNATURE)
    number = version_number(version)
    if number is not None:
        spec.version.value = number
    return spec


def _shape(name: str, proto: tf.TensorShapeProto) -> list[int]:
    if proto.unknown_rank:
        raise InvalidInput(f"input {shown(name)}: tensor_shape has unknown_rank; send the tensor's concrete shape")
    return [d.size for d in proto.dim]


def _typed_bytes(name: str, datatype: Datatype, shape: list[int], tensor: tf.TensorProto) -> bytes:
    """A tensor's typed `*_val` values as raw wire bytes, after checking their count against the shape."""
    field = VALUE_FIELDS[datatype]
    for other, _ in tensor.ListFields():
        if other.name.endswith("_val") and other.name != field:
            raise InvalidInput(f"input {shown(name)}: {datatype.value} values go in {field}, got {other.name}")
    values = getattr(tensor, field)
    count = element_count(shape) if all(d >= 0 for d in shape) else -1
    if len(values) != count:
        raise InvalidInput(
            f"input {shown(name)}: {field} holds {len(values)} values, shape {shape} needs {max(count, 0)} "
            "(send every value, or the tensor as tensor_content)"
        )
    if datatype is Datatype.BYTES:
        out = np.empty(len(values), dtype=object)
        out[:] = list(values)
        return encode_bytes_elements(out)
    dtype = NUMPY_DTYPES[datatype]
    if datatype in (Datatype.FP16, Datatype.BF16):
        wide = np.asarray(values, dtype=np.int64)
        if wide.size and (wide.min() < 0 or wide.max() > 0xFFFF):
            raise InvalidInput(f"input {shown(name)}: half_val holds values that are not 16-bit patterns")
        return wide.astype("<u2").tobytes()
    if dtype.kind in "iu" and datatype not in (Datatype.INT64, Datatype.UINT64, Datatype.UINT32):
        wide = np.asarray(values, dtype=np.int64)
        info = np.iinfo(dtype)  # type: ignore[type-var]
        if wide.size and (wide.min() < info.min or wide.max() > info.max):
            raise InvalidInput(f"input {shown(name)}: int_val holds values outside the {datatype.value} range")
        return wide.astype(dtype).tobytes()
    return np.asarray(values, dtype=dtype).tobytes()


# ---- counts before the parse: protobuf expands tiny repeated entries (an empty TensorShapeProto.Dim is 2 bytes
# on the wire and ~48 in memory), so a 32 MiB message of them would take ~770 MB and most of a second to parse ----

_MESSAGE = "PredictRequest"
# Fields of one TensorProto besides string_val's elements: dtype, shape, content, packed typed values, and spares.
_TENSOR_FIELDS = 64


def check_predict_bytes(data: bytes | memoryview, contract: RequestContract | None) -> None:
    """Bound a serialized PredictRequest before protobuf parses it: inputs and outputs counted against the
    contract's limits, each tensor's fields (string elements included) and each shape's rank bounded."""
    view = memoryview(data).cast("B")
    limits = contract.limits if contract is not None else DEFAULT_LIMITS
    caps = {1: 4, 2: limits.max_inputs, 3: limits.max_outputs, 5: 4, 6: 4, 7: 4}
    total = sum(caps.values()) + SPARE_FIELDS
    for number, wire, start, end in iter_fields(view, 0, len(view), caps, total, "the request", _MESSAGE):
        if wire != LENGTH_DELIMITED:
            continue
        if number == 5:  # predict_streamed_options: its split_dimensions map
            list(iter_fields(view, start, end, {2: 16}, 32, "predict_streamed_options", _MESSAGE))
        if number != 2:
            continue
        name, tensor = "", None
        entry = iter_fields(view, start, end, {1: 1, 2: 1}, 2, "an inputs entry", _MESSAGE)
        for part, part_wire, value, part_end in entry:
            if part == 1 and part_wire == LENGTH_DELIMITED:
                name = bytes(view[value:part_end]).decode(errors="replace")
            elif part == 2 and part_wire == LENGTH_DELIMITED:
                tensor = (value, part_end)
        if tensor is None:
            continue
        what = f"input {shown(name)}"
        fields = _TENSOR_FIELDS + limits.max_bytes_elements.get(name, 0)
        for field, field_wire, value, field_end in iter_fields(view, *tensor, {2: 4}, fields, what, _MESSAGE):
            if field == 2 and field_wire == LENGTH_DELIMITED:
                shape = f"the tensor_shape (rank at most {MAX_RANK}) of {what}"
                list(iter_fields(view, value, field_end, {2: MAX_RANK, 3: 4}, MAX_RANK + 8, shape, _MESSAGE))


def decode_predict(
    request: tfs.PredictRequest, name: str, version: str, contract: RequestContract | None
) -> InferRequest:
    """A PredictRequest for model `name` at `version`, checked against the model's contract (codec.decode_request)."""
    check_spec(request.model_spec, name, version)
    message = pb.ModelInferRequest(model_name=name)
    raw: list[bytes] = []
    for input_name, tensor in sorted(request.inputs.items()):
        datatype = DATATYPES_BY_TF.get(tensor.dtype)
        if datatype is None:
            supported = ", ".join(tf.DataType.Name(t) for t in TF_DATATYPES.values())
            known = tensor.dtype in tf.DataType.values()
            raise InvalidInput(
                f"input {shown(input_name)}: dtype {tf.DataType.Name(tensor.dtype) if known else tensor.dtype} "
                f"is not served; use one of {supported}"
            )
        shape = _shape(input_name, tensor.tensor_shape)
        message.inputs.add(name=input_name, datatype=datatype.value, shape=shape)
        if tensor.tensor_content and datatype is not Datatype.BYTES:
            raw.append(tensor.tensor_content)
        else:
            raw.append(_typed_bytes(input_name, datatype, shape, tensor))
    for output in request.output_filter:
        message.outputs.add(name=output)
    return decode_request(message, raw, contract)


def encode_tensor(tensor: Tensor) -> tf.TensorProto:
    """An output as TF Serving returns it: dtype, shape, and tensor_content (string_val for strings)."""
    proto = tf.TensorProto(dtype=TF_DATATYPES[tensor.datatype])
    proto.tensor_shape.dim.extend(tf.TensorShapeProto.Dim(size=d) for d in tensor.shape)
    if tensor.datatype is Datatype.BYTES:
        proto.string_val.extend(
            item.encode() if isinstance(item, str) else bytes(item) for item in tensor.data.reshape(-1).tolist()
        )
    else:
        proto.tensor_content = encode_tensor_bytes(tensor)
    return proto


def encode_predict(response: InferResponse) -> tfs.PredictResponse:
    reply = tfs.PredictResponse(model_spec=served_spec(response.model_name, response.model_version))
    for tensor in response.outputs:
        reply.outputs[tensor.name].CopyFrom(encode_tensor(tensor))
    return reply


def _tensor_info(spec: TensorSpec) -> tf.TensorInfo:
    info = tf.TensorInfo(name=spec.name, dtype=TF_DATATYPES[spec.datatype])
    info.tensor_shape.dim.extend(tf.TensorShapeProto.Dim(size=d) for d in spec.shape)
    return info


def signature_def_map(signature: ModelSignature) -> tfs.SignatureDefMap:
    """The model's signature as a SavedModel's `serving_default` (-1 marks a variable dimension, as in TF)."""
    definition = tf.SignatureDef(method_name=PREDICT_METHOD)
    for spec in signature.inputs:
        definition.inputs[spec.name].CopyFrom(_tensor_info(spec))
    for spec in signature.outputs:
        definition.outputs[spec.name].CopyFrom(_tensor_info(spec))
    result = tfs.SignatureDefMap()
    result.signature_def[DEFAULT_SIGNATURE].CopyFrom(definition)
    return result


def encode_metadata(
    request: tfs.GetModelMetadataRequest, name: str, version: str, signature: ModelSignature
) -> tfs.GetModelMetadataResponse:
    """GetModelMetadata: TF Serving answers only the `signature_def` field, and requires it to be asked for."""
    check_spec(request.model_spec, name, version, signature=False)
    fields = list(request.metadata_field)
    if not fields:
        raise InvalidInput(f"GetModelMetadataRequest must name at least one metadata_field ({SIGNATURE_DEF_FIELD!r})")
    unknown = [f for f in fields if f != SIGNATURE_DEF_FIELD]
    if unknown:
        raise InvalidInput(f"metadata field {shown(unknown[0])} is not supported; ask for {SIGNATURE_DEF_FIELD!r}")
    reply = tfs.GetModelMetadataResponse(model_spec=served_spec(name, version))
    reply.model_spec.ClearField("signature_name")
    reply.metadata[SIGNATURE_DEF_FIELD].Pack(signature_def_map(signature))
    return reply


# ModelService/GetModelStatus: the TF Serving state for each ModelService state (service.ModelState values).
TF_STATES: Mapping[str, tfs.ModelVersionStatus.State] = {
    "LOADING": tfs.ModelVersionStatus.LOADING,
    "READY": tfs.ModelVersionStatus.AVAILABLE,
    "STOPPING": tfs.ModelVersionStatus.UNLOADING,
    "FAILED": tfs.ModelVersionStatus.END,
}


def encode_status(
    request: tfs.GetModelStatusRequest, name: str, version: str, state: str, error: str | None = None
) -> tfs.GetModelStatusResponse:
    """GetModelStatus: the one version this pod serves, its state, and the load error when it failed."""
    check_spec(request.model_spec, name, version, signature=False)
    status = tfs.StatusProto()
    if error:
        status.error_code, status.error_message = tf_error.UNKNOWN, error
    entry = tfs.ModelVersionStatus(version=version_number(version) or 0, state=TF_STATES[state], status=status)
    return tfs.GetModelStatusResponse(model_version_status=[entry])
