"""Reads a model's input/output signature from a Paddle 3.x PIR program (`<prefix>.json`) without Paddle."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from skiff_runtime.errors import ModelLoadError
from skiff_runtime.tensors import NUMPY_DTYPES, Datatype, ModelSignature, TensorSpec

# Paddle dtype names (op attributes) and PIR type tags, to OIP datatypes.
PADDLE_DTYPES: Mapping[str, Datatype] = {
    "bool": Datatype.BOOL,
    "uint8": Datatype.UINT8,
    "int8": Datatype.INT8,
    "int16": Datatype.INT16,
    "int32": Datatype.INT32,
    "int64": Datatype.INT64,
    "float16": Datatype.FP16,
    "bfloat16": Datatype.BF16,
    "float32": Datatype.FP32,
    "float64": Datatype.FP64,
}
PIR_TYPE_TAGS: Mapping[str, Datatype] = {
    "0.t_bool": Datatype.BOOL,
    "0.t_ui8": Datatype.UINT8,
    "0.t_i8": Datatype.INT8,
    "0.t_i16": Datatype.INT16,
    "0.t_i32": Datatype.INT32,
    "0.t_i64": Datatype.INT64,
    "0.t_f16": Datatype.FP16,
    "0.t_bf16": Datatype.BF16,
    "0.t_f32": Datatype.FP32,
    "0.t_f64": Datatype.FP64,
}


def _ops(program: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for region in program.get("program", {}).get("regions", []):
        for block in region.get("blocks", []):
            yield from block.get("ops", [])


def _attrs(op: Mapping[str, Any]) -> dict[str, Any]:
    return {a.get("N"): a.get("AT", {}).get("D") for a in op.get("A", [])}


def _output_type(op: Mapping[str, Any]) -> tuple[Datatype, tuple[int, ...]]:
    outputs = op.get("O") or [{}]
    tensor_type = outputs[0].get("TT", {}).get("D") or []
    if len(tensor_type) < 2 or not isinstance(tensor_type[0], dict):
        raise ModelLoadError(f"PIR op {op.get('#')!r} has no dense tensor type")
    tag = tensor_type[0].get("#", "")
    if tag not in PIR_TYPE_TAGS:
        raise ModelLoadError(f"PIR type {tag!r} has no Open Inference Protocol datatype")
    return PIR_TYPE_TAGS[tag], tuple(int(d) for d in tensor_type[1])


def read_pir_signature(text: str) -> ModelSignature:
    """Inputs from the program's `data` ops, outputs from its `fetch` ops, in program order."""
    try:
        program = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"model program is not valid JSON: {exc}") from None
    base_code = program.get("base_code") if isinstance(program, dict) else None
    if not isinstance(base_code, dict) or base_code.get("magic") != "pir":
        raise ModelLoadError("model program is not a Paddle PIR program (no base_code.magic == 'pir')")
    inputs: list[TensorSpec] = []
    outputs: list[tuple[int, TensorSpec]] = []
    for op in _ops(program):
        kind = str(op.get("#", "")).split(".", 1)[-1]
        if kind == "data":
            attrs = _attrs(op)
            dtype_name = str(attrs.get("dtype"))
            if dtype_name not in PADDLE_DTYPES:
                raise ModelLoadError(f"input {attrs.get('name')!r} has unsupported dtype {dtype_name!r}")
            shape = tuple(int(d) for d in attrs.get("shape") or _output_type(op)[1])
            inputs.append(TensorSpec(str(attrs["name"]), PADDLE_DTYPES[dtype_name], shape))
        elif kind == "fetch":
            attrs = _attrs(op)
            datatype, shape = _output_type(op)
            outputs.append((int(attrs.get("col", len(outputs))), TensorSpec(str(attrs["name"]), datatype, shape)))
    if not inputs or not outputs:
        raise ModelLoadError(f"PIR program declares {len(inputs)} inputs and {len(outputs)} outputs; need both")
    return ModelSignature(tuple(inputs), tuple(spec for _, spec in sorted(outputs, key=lambda o: o[0])))


def tensors_bytes(tensors: Iterable[tuple[Datatype, Sequence[int]]], batch: int) -> int | None:
    """Bytes of `tensors` when their one dynamic (-1) dimension, the batch, is `batch`; None when a tensor has
    several dynamic dimensions (its size is unknown before a request arrives)."""
    total = 0
    for datatype, dims in tensors:
        dynamic = sum(1 for d in dims if d < 0)
        if dynamic > 1:
            return None
        total += math.prod(batch if d < 0 else d for d in dims) * NUMPY_DTYPES[datatype].itemsize
    return total


def pir_intermediates(text: str) -> list[tuple[Datatype, tuple[int, ...]]]:
    """Type and shape of every value the program computes (parameters and inputs excluded): what Paddle keeps
    between runs when its garbage collector is off. An upper bound: IR passes fuse some of these away."""
    found = []
    for op in _ops(json.loads(text)):
        if op.get("#") == "p" or str(op.get("#", "")).split(".", 1)[-1] == "data":
            continue
        outputs = op.get("O") or []
        for output in [outputs] if isinstance(outputs, dict) else outputs:
            tensor_type = output.get("TT", {}).get("D") if isinstance(output, dict) else None
            if not tensor_type or len(tensor_type) < 2 or not isinstance(tensor_type[0], dict):
                continue
            datatype = PIR_TYPE_TAGS.get(tensor_type[0].get("#", ""))
            if datatype is not None:
                found.append((datatype, tuple(int(d) for d in tensor_type[1])))
    return found
