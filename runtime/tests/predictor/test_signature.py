"""Reading a model's signature from a hand-written Paddle 3.x PIR program, without Paddle."""

from __future__ import annotations

import json
from typing import Any

import pytest

from skiff_runtime.errors import ModelLoadError
from skiff_runtime.predictor.signature import pir_intermediates, read_pir_signature, tensors_bytes
from skiff_runtime.tensors import Datatype, ModelSignature, TensorSpec


def dense(tag: str, shape: list[int]) -> dict[str, Any]:
    return {"#": "0.t_dtensor", "D": [{"#": tag}, shape, "NCHW", [], 0]}


def data_op(name: str, dtype: str, shape: list[int], tag: str = "0.t_f32", result: int = 1) -> dict[str, Any]:
    return {
        "#": "1.data",
        "A": [
            {"AT": {"#": "0.a_str", "D": name}, "N": "name"},
            {"AT": {"#": "1.a_intarray", "D": shape}, "N": "shape"},
            {"AT": {"#": "1.a_dtype", "D": dtype}, "N": "dtype"},
        ],
        "O": [{"%": result, "TT": dense(tag, shape)}],
    }


def fetch_op(name: str, col: int, tag: str, shape: list[int], result: int = 10) -> dict[str, Any]:
    return {
        "#": "1.fetch",
        "A": [
            {"AT": {"#": "0.a_str", "D": name}, "N": "name"},
            {"AT": {"#": "0.a_i32", "D": col}, "N": "col"},
        ],
        "O": [{"%": result, "TT": dense(tag, shape)}],
    }


def program(*ops: dict[str, Any], magic: str = "pir") -> str:
    return json.dumps(
        {
            "base_code": {"magic": magic, "trainable": False, "version": 1},
            "program": {"regions": [{"#": "region_0", "blocks": [{"#": "block_0", "args": [], "ops": list(ops)}]}]},
        }
    )


MATMUL = {"#": "1.matmul", "A": [], "I": [{"%": 1}, {"%": 2}], "O": [{"%": 3, "TT": dense("0.t_f32", [-1, 4])}]}


def test_reads_inputs_in_program_order_and_outputs_by_col() -> None:
    text = program(
        data_op("x", "float32", [-1, 4]),
        data_op("ids", "int64", [-1], tag="0.t_i64", result=2),
        MATMUL,
        fetch_op("second", 1, "0.t_i64", [-1], result=11),
        fetch_op("first", 0, "0.t_f32", [-1, 4]),
    )
    assert read_pir_signature(text) == ModelSignature(
        inputs=(TensorSpec("x", Datatype.FP32, (-1, 4)), TensorSpec("ids", Datatype.INT64, (-1,))),
        outputs=(TensorSpec("first", Datatype.FP32, (-1, 4)), TensorSpec("second", Datatype.INT64, (-1,))),
    )


@pytest.mark.parametrize(
    ("dtype", "datatype"),
    [
        ("bool", Datatype.BOOL),
        ("uint8", Datatype.UINT8),
        ("int8", Datatype.INT8),
        ("int16", Datatype.INT16),
        ("int32", Datatype.INT32),
        ("int64", Datatype.INT64),
        ("float16", Datatype.FP16),
        ("bfloat16", Datatype.BF16),
        ("float32", Datatype.FP32),
        ("float64", Datatype.FP64),
    ],
)
def test_input_dtypes_map_to_datatypes(dtype: str, datatype: Datatype) -> None:
    signature = read_pir_signature(program(data_op("x", dtype, [2]), fetch_op("y", 0, "0.t_f32", [2])))
    assert signature.inputs[0].datatype is datatype


@pytest.mark.parametrize(
    ("tag", "datatype"),
    [
        ("0.t_bool", Datatype.BOOL),
        ("0.t_ui8", Datatype.UINT8),
        ("0.t_i8", Datatype.INT8),
        ("0.t_i16", Datatype.INT16),
        ("0.t_i32", Datatype.INT32),
        ("0.t_i64", Datatype.INT64),
        ("0.t_f16", Datatype.FP16),
        ("0.t_bf16", Datatype.BF16),
        ("0.t_f32", Datatype.FP32),
        ("0.t_f64", Datatype.FP64),
    ],
)
def test_output_type_tags_map_to_datatypes(tag: str, datatype: Datatype) -> None:
    signature = read_pir_signature(program(data_op("x", "float32", [2]), fetch_op("y", 0, tag, [3, -1])))
    assert signature.outputs == (TensorSpec("y", datatype, (3, -1)),)


def test_input_without_shape_attribute_takes_its_result_type_shape() -> None:
    op = data_op("x", "float32", [-1, 8])
    op["A"] = [a for a in op["A"] if a["N"] != "shape"]
    signature = read_pir_signature(program(op, fetch_op("y", 0, "0.t_f32", [-1])))
    assert signature.inputs == (TensorSpec("x", Datatype.FP32, (-1, 8)),)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{not json", "not valid JSON"),
        ("", "not valid JSON"),
        ("[]", "not a Paddle PIR program"),
        ('"pir"', "not a Paddle PIR program"),
        ('{"base_code": "pir"}', "not a Paddle PIR program"),
        ("{}", "not a Paddle PIR program"),
        (program(data_op("x", "float32", [1]), fetch_op("y", 0, "0.t_f32", [1]), magic="other"), "magic == 'pir'"),
    ],
    ids=["truncated", "empty", "list", "string", "base-code-not-object", "no-base-code", "other-magic"],
)
def test_not_a_pir_program(text: str, fragment: str) -> None:
    with pytest.raises(ModelLoadError, match="model program") as info:
        read_pir_signature(text)
    assert fragment in str(info.value)


def test_no_inputs() -> None:
    with pytest.raises(ModelLoadError, match="declares 0 inputs and 1 outputs; need both"):
        read_pir_signature(program(MATMUL, fetch_op("y", 0, "0.t_f32", [1])))


def test_no_outputs() -> None:
    with pytest.raises(ModelLoadError, match="declares 1 inputs and 0 outputs; need both"):
        read_pir_signature(program(data_op("x", "float32", [1]), MATMUL))


def test_unsupported_input_dtype_names_the_input() -> None:
    text = program(data_op("z", "complex64", [2], tag="0.t_c64"), fetch_op("y", 0, "0.t_f32", [1]))
    with pytest.raises(ModelLoadError, match="input 'z' has unsupported dtype 'complex64'"):
        read_pir_signature(text)


def test_unsupported_output_type_names_the_tag() -> None:
    text = program(data_op("x", "float32", [2]), fetch_op("y", 0, "0.t_c128", [1]))
    with pytest.raises(ModelLoadError, match=r"PIR type '0\.t_c128' has no Open Inference Protocol datatype"):
        read_pir_signature(text)


def test_output_without_dense_tensor_type() -> None:
    op = fetch_op("y", 0, "0.t_f32", [1])
    op["O"] = [{"%": 10, "TT": {"#": "0.t_vec", "D": []}}]
    with pytest.raises(ModelLoadError, match=r"PIR op '1\.fetch' has no dense tensor type"):
        read_pir_signature(program(data_op("x", "float32", [2]), op))


def test_intermediates_are_the_computed_values_without_parameters_or_inputs() -> None:
    parameter = {"#": "p", "A": [0, 1, 1, "w"], "O": {"%": 2, "TT": dense("0.t_f32", [4, 4])}}
    text = program(
        parameter, data_op("x", "float32", [-1, 4]), MATMUL, fetch_op("out", 0, "0.t_f32", [-1, 4], result=4)
    )
    assert pir_intermediates(text) == [(Datatype.FP32, (-1, 4)), (Datatype.FP32, (-1, 4))]
    assert tensors_bytes(pir_intermediates(text), batch=8) == 2 * 8 * 4 * 4


def test_tensor_bytes_use_each_datatype_size_and_the_batch_for_the_dynamic_dimension() -> None:
    tensors = [(Datatype.INT64, (-1, 3)), (Datatype.FP16, (2, 5)), (Datatype.BOOL, (-1,))]
    assert tensors_bytes(tensors, batch=4) == 4 * 3 * 8 + 2 * 5 * 2 + 4 * 1


def test_tensor_bytes_are_unknown_when_a_tensor_has_two_dynamic_dimensions() -> None:
    assert tensors_bytes([(Datatype.FP32, (-1, 3)), (Datatype.FP32, (-1, -1, 8))], batch=4) is None
