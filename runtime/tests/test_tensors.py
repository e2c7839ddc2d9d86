"""The datatype <-> numpy table is complete, little-endian and invertible; parse_datatype errors are helpful."""

from __future__ import annotations

import numpy as np
import pytest

from skiff_runtime.errors import InvalidInput
from skiff_runtime.tensors import (
    DATATYPES_BY_DTYPE,
    FIXED_SIZE_DATATYPES,
    NUMPY_DTYPES,
    Datatype,
    ModelSignature,
    Tensor,
    TensorSpec,
    datatype_of,
    element_count,
    parse_datatype,
)

ITEMSIZES = {
    Datatype.BOOL: 1,
    Datatype.UINT8: 1,
    Datatype.UINT16: 2,
    Datatype.UINT32: 4,
    Datatype.UINT64: 8,
    Datatype.INT8: 1,
    Datatype.INT16: 2,
    Datatype.INT32: 4,
    Datatype.INT64: 8,
    Datatype.FP16: 2,
    Datatype.FP32: 4,
    Datatype.FP64: 8,
    Datatype.BF16: 2,
}


def test_every_datatype_has_a_numpy_dtype() -> None:
    assert set(NUMPY_DTYPES) == set(Datatype)


def test_fixed_size_datatypes_are_all_but_bytes() -> None:
    assert set(Datatype) - {Datatype.BYTES} == FIXED_SIZE_DATATYPES


@pytest.mark.parametrize("datatype", sorted(ITEMSIZES), ids=str)
def test_wire_dtype_has_the_protocol_element_size_and_is_little_endian(datatype: Datatype) -> None:
    dtype = NUMPY_DTYPES[datatype]
    assert dtype.itemsize == ITEMSIZES[datatype]
    assert dtype.byteorder in ("<", "|", "=")
    assert dtype.newbyteorder("<") == dtype


@pytest.mark.parametrize("datatype", sorted(FIXED_SIZE_DATATYPES - {Datatype.BF16}), ids=str)
def test_fixed_size_datatype_round_trips_through_datatype_of(datatype: Datatype) -> None:
    array = np.zeros((2, 3), dtype=NUMPY_DTYPES[datatype])
    assert datatype_of(array) is datatype


def test_bf16_shares_uint16_and_comes_back_as_uint16() -> None:
    assert NUMPY_DTYPES[Datatype.BF16] == NUMPY_DTYPES[Datatype.UINT16]
    assert datatype_of(np.zeros(2, dtype=NUMPY_DTYPES[Datatype.BF16])) is Datatype.UINT16
    assert Datatype.BF16 not in DATATYPES_BY_DTYPE.values()


def test_inverse_table_has_one_entry_per_distinct_dtype() -> None:
    assert len(DATATYPES_BY_DTYPE) == len(NUMPY_DTYPES) - 1
    for dtype, datatype in DATATYPES_BY_DTYPE.items():
        assert NUMPY_DTYPES[datatype].newbyteorder("=") == dtype


@pytest.mark.parametrize("dtype", ["<i4", ">i4", "=i4"])
def test_datatype_of_ignores_byte_order(dtype: str) -> None:
    assert datatype_of(np.zeros(1, dtype=dtype)) is Datatype.INT32


@pytest.mark.parametrize(
    "array",
    [np.array([b"a", b"bc"], dtype=object), np.array([b"a", b"bc"]), np.array(["a", "bc"])],
    ids=["object", "bytes_", "str_"],
)
def test_object_bytes_and_str_arrays_are_bytes(array: np.ndarray) -> None:
    assert datatype_of(array) is Datatype.BYTES


@pytest.mark.parametrize("dtype", ["c8", "c16", "M8[s]", "m8[s]", "V4"])
def test_datatype_of_rejects_dtypes_outside_the_protocol(dtype: str) -> None:
    with pytest.raises(InvalidInput, match="has no Open Inference Protocol datatype"):
        datatype_of(np.zeros(1, dtype=dtype))


@pytest.mark.parametrize("datatype", list(Datatype), ids=str)
def test_parse_datatype_accepts_every_wire_name(datatype: Datatype) -> None:
    assert parse_datatype(datatype.value, "x") is datatype


@pytest.mark.parametrize("name", ["FLOAT32", "fp32", "", "STRING", "INT4"])
def test_parse_datatype_error_names_the_tensor_and_lists_allowed_types(name: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_datatype(name, "images")
    message = str(info.value)
    assert "'images'" in message
    assert repr(name) in message
    for datatype in Datatype:
        assert datatype.value in message


def test_element_count_uses_python_ints_for_huge_shapes() -> None:
    assert element_count((10**6, 10**6, 10**6)) == 10**18
    assert element_count(()) == 1
    assert element_count((3, 0, 5)) == 0


def test_signature_looks_up_tensors_by_name() -> None:
    x = TensorSpec("x", Datatype.FP32, (-1, 4))
    y = TensorSpec("y", Datatype.INT64, (-1,))
    signature = ModelSignature(inputs=(x,), outputs=(y,))
    assert signature.input("x") is x
    assert signature.input("y") is None
    assert signature.output("y") is y
    assert signature.output("x") is None
    assert x.describe() == "FP32[-1, 4]"


def test_tensor_shape_is_a_tuple_of_python_ints() -> None:
    tensor = Tensor("x", Datatype.FP32, np.zeros((2, 3), dtype=np.float32))
    assert tensor.shape == (2, 3)
    assert all(type(d) is int for d in tensor.shape)


def _signature(input_shape: tuple[int, ...], output_shape: tuple[int, ...]) -> ModelSignature:
    return ModelSignature(
        (TensorSpec("x", Datatype.FP32, input_shape),), (TensorSpec("y", Datatype.FP32, output_shape),)
    )


def test_a_signature_is_batched_only_with_a_batch_dimension_on_every_input_and_output() -> None:
    assert _signature((-1, 4), (-1,)).batched
    assert not _signature((1, 4), (-1,)).batched
    assert not _signature((-1, 4), (4,)).batched  # an output without one: not merged, not reported batched
    assert not _signature((-1, 4), ()).batched
