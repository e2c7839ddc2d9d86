"""V2 REST (KServe/Triton HTTP) <-> domain: infer bodies, JSON or JSON plus binary tensors, to InferRequest and back.

A body is a JSON header, optionally followed by the binary tensor data extension: `Inference-Header-Content-Length`
says where the JSON ends, and each input with `parameters.binary_data_size` takes that many bytes of the rest, in
input order. Every input becomes raw wire bytes and goes through `codec.decode_request` with the model's
contract (validation.py), so REST requests get the same checks (and the same messages) as gRPC ones. JSON data is
converted with numpy in one step per tensor, never element by element in Python.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from skiff_runtime.codec import (
    DEFAULT_LIMITS,
    RequestContract,
    decode_request,
    encode_bytes_elements,
    encode_tensor_bytes,
)
from skiff_runtime.errors import InvalidInput, shown
from skiff_runtime.model_config import ConfigTensor, ModelConfig
from skiff_runtime.proto import inference_pb2 as pb
from skiff_runtime.tensors import (
    NUMPY_DTYPES,
    Datatype,
    InferRequest,
    InferResponse,
    ModelSignature,
    Tensor,
    element_count,
    parse_datatype,
)
from skiff_runtime.timing import TIMING_PARAMETER

HEADER_LENGTH = "Inference-Header-Content-Length"
JSON_TYPE = "application/json"
BINARY_TYPE = "application/octet-stream"

# JSON is parsed by the C scanner on the event loop, and expands: a body of empty lists takes ~3 us and ~75 bytes per
# 3-byte `[],`. So the JSON part is bounded (tensors beyond it travel binary), and so are its arrays and objects,
# counted with bytes.count before the parse. Nested `data` needs one array per row: send it flat past the limit.
MAX_JSON_BYTES = 8 * 1024 * 1024
MAX_JSON_CONTAINERS = 65536
# How many bytes of memory one JSON byte may take while parsed (numbers as Python objects): the request-memory
# budget holds this much for the JSON part.
JSON_EXPANSION = 8

# numpy kinds a JSON array may arrive as, per datatype: JSON numbers parse to int or float, strings to unicode.
_JSON_KINDS: Mapping[Datatype, str] = {
    Datatype.BOOL: "b",
    **{d: "iu" for d in (Datatype.UINT8, Datatype.UINT16, Datatype.UINT32, Datatype.UINT64)},
    **{d: "iu" for d in (Datatype.INT8, Datatype.INT16, Datatype.INT32, Datatype.INT64)},
    **{d: "iuf" for d in (Datatype.FP16, Datatype.FP32, Datatype.FP64)},
    Datatype.BYTES: "U",
}


@dataclass(frozen=True)
class RestRequest:
    """A decoded infer body, and how each output is to be returned (binary or JSON)."""

    request: InferRequest
    binary_outputs: Callable[[str], bool]


@dataclass(frozen=True)
class RestBody:
    """An encoded response: the bytes and, when binary tensors follow the JSON, the JSON's length."""

    body: bytes
    header_length: int | None = None

    @property
    def content_type(self) -> str:
        return JSON_TYPE if self.header_length is None else BINARY_TYPE


MAX_HEADER_LENGTH_DIGITS = 20


def parse_header_length(value: str | None, body_length: int) -> int | None:
    """The Inference-Header-Content-Length header: the JSON's byte length, within the body."""
    if value is None:
        return None
    # At most 20 ASCII digits (any byte count fits): int() is never asked to parse 4,301 digits (Python refuses
    # that with ValueError: a 500 per request) or a Unicode digit such as '²' (isdigit() accepts it, int() not).
    digits = value.strip()
    usable = 0 < len(digits) <= MAX_HEADER_LENGTH_DIGITS and digits.isascii() and digits.isdigit()
    if not usable or int(digits) > body_length:
        raise InvalidInput(
            f"{HEADER_LENGTH}: {shown(value)} is not a byte count within the {body_length}-byte body; "
            "it must be the length of the JSON header that starts the body"
        )
    return int(digits)


def _load_json(data: bytes | memoryview) -> dict[str, Any]:
    data = bytes(data)
    if len(data) > MAX_JSON_BYTES:
        raise InvalidInput(
            f"the JSON part of the request is {len(data)} bytes, more than {MAX_JSON_BYTES}; send large tensors as "
            f"binary data (parameters.binary_data_size and the {HEADER_LENGTH} header) or over gRPC"
        )
    containers = data.count(b"[") + data.count(b"{")
    if containers > MAX_JSON_CONTAINERS:
        raise InvalidInput(
            f"the JSON request holds {containers} arrays and objects, more than {MAX_JSON_CONTAINERS}; send 'data' "
            "flat (row-major) instead of nested, or as binary data"
        )
    try:
        header = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(f"the request body is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(header, dict):
        raise InvalidInput(f"the request body must be a JSON object, got {type(header).__name__}")
    return header


def _field(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str, default: Any = None) -> Any:
    value = obj.get(key, default)
    if value is default and key not in obj:
        return default
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise InvalidInput(f"{where}: {key!r} must be {names}, got {type(value).__name__}")
    return value


def _shape(item: Mapping[str, Any], where: str) -> list[int]:
    shape: list[int] = _field(item, "shape", list, where, [])
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise InvalidInput(f"{where}: 'shape' must be a list of integers, got {str(shape)[:100]}")
    if any(d < 0 or d >= 1 << 62 for d in shape):
        raise InvalidInput(f"{where}: shape {str(shape)[:100]} has a dimension outside 0..2^62")
    return shape


def _json_tensor_bytes(name: str, datatype: Datatype, shape: Sequence[int], data: Any) -> bytes:
    """A JSON `data` array (flat or nested, row-major) as the tensor's raw wire bytes."""
    if datatype is Datatype.BF16:
        raise InvalidInput(f"input {shown(name)}: BF16 travels only as binary data (parameters.binary_data_size)")
    try:
        array = np.asarray(data if isinstance(data, list) else [data])
    except (ValueError, TypeError):
        raise InvalidInput(f"input {shown(name)}: 'data' is a ragged array; nest it evenly or send it flat") from None
    if array.size and array.dtype.kind not in _JSON_KINDS[datatype]:
        raise InvalidInput(
            f"input {shown(name)}: 'data' holds {array.dtype.kind!r}-kind values ({str(data)[:60]}...), "
            f"not {datatype.value} values"
        )
    flat = array.reshape(-1)
    count = element_count(shape)
    if flat.size != count:
        raise InvalidInput(
            f"input {shown(name)}: 'data' holds {flat.size} elements, {datatype.value}{list(shape)} needs {count}"
        )
    if datatype is Datatype.BYTES:
        return encode_bytes_elements(flat.astype(object))
    dtype = NUMPY_DTYPES[datatype]
    if dtype.kind in "iu" and flat.size:
        info = np.iinfo(dtype)  # type: ignore[type-var]
        low, high = flat.min(), flat.max()
        if low < info.min or high > info.max:
            bad = low if low < info.min else high
            raise InvalidInput(
                f"input {shown(name)}: {bad} is outside the {datatype.value} range {info.min}..{info.max}"
            )
    return flat.astype(dtype).tobytes()


def decode_infer_body(
    body: bytes,
    header_length: int | None,
    model_name: str,
    model_version: str,
    contract: RequestContract | None,
) -> RestRequest:
    """An infer request body, checked against the model's contract (codec.decode_request)."""
    view = memoryview(body)
    json_end = len(body) if header_length is None else header_length
    header = _load_json(view[:json_end])
    binary = view[json_end:]
    limits = contract.limits if contract is not None else DEFAULT_LIMITS
    inputs = _field(header, "inputs", list, "the request", [])
    outputs = _field(header, "outputs", list, "the request", [])
    if len(inputs) > limits.max_inputs or len(outputs) > limits.max_outputs:
        raise InvalidInput(f"the request has {len(inputs)} inputs and {len(outputs)} outputs; {limits.hint}")
    request_id = _field(header, "id", str, "the request", "")
    parameters = _field(header, "parameters", dict, "the request", {})
    message = pb.ModelInferRequest(model_name=model_name, model_version=model_version, id=request_id)
    timing = _field(parameters, TIMING_PARAMETER, bool, "the request", None)
    if timing is not None:
        message.parameters[TIMING_PARAMETER].bool_param = timing
    raw: list[bytes | memoryview] = []
    offset = 0
    for index, item in enumerate(inputs):
        where = f"input {index}"
        if not isinstance(item, dict):
            raise InvalidInput(f"{where} must be a JSON object, got {type(item).__name__}")
        name = _field(item, "name", str, where, "")
        datatype_name = _field(item, "datatype", str, where, "")
        shape = _shape(item, f"input {shown(name)}")
        message.inputs.add(name=name, datatype=datatype_name, shape=shape)
        size = _field(_field(item, "parameters", dict, where, {}), "binary_data_size", int, where)
        if size is not None:
            if "data" in item:
                raise InvalidInput(f"input {shown(name)} has both 'data' and binary_data_size; send one")
            if size < 0 or offset + size > len(binary):
                raise InvalidInput(
                    f"input {shown(name)}: binary_data_size {size} runs past the {len(binary)} binary bytes "
                    f"after the JSON header ({HEADER_LENGTH})"
                )
            raw.append(binary[offset : offset + size])
            offset += size
        elif "data" in item:
            datatype = parse_datatype(datatype_name, name)
            raw.append(_json_tensor_bytes(name, datatype, shape, item["data"]))
        else:
            raise InvalidInput(f"input {shown(name)} has no 'data' and no parameters.binary_data_size")
    if offset != len(binary):
        raise InvalidInput(
            f"the body has {len(binary)} binary bytes after the JSON header but the inputs' binary_data_size "
            f"add up to {offset}"
        )
    binary_default = bool(_field(parameters, "binary_data_output", bool, "the request", False))
    binary_by_name: dict[str, bool] = {}
    for index, item in enumerate(outputs):
        where = f"requested output {index}"
        if not isinstance(item, dict):
            raise InvalidInput(f"{where} must be a JSON object, got {type(item).__name__}")
        name = _field(item, "name", str, where, "")
        message.outputs.add(name=name)
        flag = _field(_field(item, "parameters", dict, where, {}), "binary_data", bool, where)
        binary_by_name[name] = binary_default if flag is None else flag
    decoded = decode_request(message, raw, contract)
    return RestRequest(decoded, lambda name: binary_by_name.get(name, binary_default))


def _json_data(tensor: Tensor) -> list[Any]:
    flat = tensor.data.reshape(-1)
    if tensor.datatype is Datatype.BYTES:
        try:
            return [item if isinstance(item, str) else bytes(item).decode() for item in flat.tolist()]
        except UnicodeDecodeError:
            raise InvalidInput(
                f"output {shown(tensor.name)} is not UTF-8 text; request it with parameters.binary_data true"
            ) from None
    if tensor.datatype is Datatype.BF16:
        raise InvalidInput(f"output {shown(tensor.name)} is BF16; request it with parameters.binary_data true")
    values: list[Any] = flat.tolist()
    return values


def encode_infer_body(response: InferResponse, binary: Callable[[str], bool]) -> RestBody:
    """The response body: outputs as JSON `data`, or as binary after the JSON where `binary(name)`."""
    outputs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for tensor in response.outputs:
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype.value, "shape": list(tensor.shape)}
        if binary(tensor.name):
            blob = encode_tensor_bytes(tensor)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = _json_data(tensor)
        outputs.append(entry)
    head: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        head["id"] = response.id
    if response.parameters:
        head["parameters"] = dict(response.parameters)
    head["outputs"] = outputs
    text = json.dumps(head, separators=(",", ":")).encode()
    if not blobs:
        return RestBody(text)
    return RestBody(b"".join([text, *blobs]), header_length=len(text))


def model_metadata(name: str, version: str, platform: str, signature: ModelSignature) -> dict[str, Any]:
    """GET /v2/models/{name}: the same facts as gRPC ModelMetadata, shapes as JSON integers."""

    def tensors(specs: Sequence[Any]) -> list[dict[str, Any]]:
        return [{"name": t.name, "datatype": t.datatype.value, "shape": list(t.shape)} for t in specs]

    return {
        "name": name,
        "versions": [version],
        "platform": platform,
        "inputs": tensors(signature.inputs),
        "outputs": tensors(signature.outputs),
    }


def model_config_body(config: ModelConfig) -> dict[str, Any]:
    """GET /v2/models/{name}/config: the same configuration as gRPC ModelConfig, as Triton's HTTP API shows it."""

    def tensors(items: Sequence[ConfigTensor]) -> list[dict[str, Any]]:
        return [{"name": t.name, "data_type": t.data_type, "dims": list(t.dims)} for t in items]

    return {
        "name": config.name,
        "platform": config.platform,
        "backend": config.backend,
        "max_batch_size": config.max_batch_size,
        "input": tensors(config.inputs),
        "output": tensors(config.outputs),
    }


def error_body(message: str) -> bytes:
    """The error body Triton and KServe send, which tritonclient.http raises as InferenceServerException."""
    return json.dumps({"error": message}).encode()
