"""Tensors and model signatures: the Open Inference Protocol datatypes and their numpy dtypes, in one table."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from skiff_runtime.errors import InvalidInput, shown


class Datatype(enum.StrEnum):
    """The OIP tensor datatypes (the strings travel on the wire)."""

    BOOL = "BOOL"
    UINT8 = "UINT8"
    UINT16 = "UINT16"
    UINT32 = "UINT32"
    UINT64 = "UINT64"
    INT8 = "INT8"
    INT16 = "INT16"
    INT32 = "INT32"
    INT64 = "INT64"
    FP16 = "FP16"
    FP32 = "FP32"
    FP64 = "FP64"
    BF16 = "BF16"
    BYTES = "BYTES"


# Wire dtype per datatype: little-endian, as the protocol specifies. BF16 travels as its raw 16-bit pattern
# (numpy has no bfloat16); BYTES elements are Python bytes objects in an object array.
NUMPY_DTYPES: Mapping[Datatype, np.dtype[np.generic]] = {
    Datatype.BOOL: np.dtype("?"),
    Datatype.UINT8: np.dtype("u1"),
    Datatype.UINT16: np.dtype("<u2"),
    Datatype.UINT32: np.dtype("<u4"),
    Datatype.UINT64: np.dtype("<u8"),
    Datatype.INT8: np.dtype("i1"),
    Datatype.INT16: np.dtype("<i2"),
    Datatype.INT32: np.dtype("<i4"),
    Datatype.INT64: np.dtype("<i8"),
    Datatype.FP16: np.dtype("<f2"),
    Datatype.FP32: np.dtype("<f4"),
    Datatype.FP64: np.dtype("<f8"),
    Datatype.BF16: np.dtype("<u2"),
    Datatype.BYTES: np.dtype("O"),
}

# The inverse, written once from the table above (BF16 is only reachable by name: it shares uint16's layout).
DATATYPES_BY_DTYPE: Mapping[np.dtype[np.generic], Datatype] = {
    dtype.newbyteorder("="): datatype for datatype, dtype in NUMPY_DTYPES.items() if datatype is not Datatype.BF16
}

FIXED_SIZE_DATATYPES = frozenset(d for d in Datatype if d is not Datatype.BYTES)

Array = npt.NDArray[np.generic]


def parse_datatype(name: str, tensor: str) -> Datatype:
    """The Datatype for a wire string, or InvalidInput naming the tensor."""
    try:
        return Datatype(name)
    except ValueError:
        allowed = ", ".join(d.value for d in Datatype)
        raise InvalidInput(
            f"tensor {shown(tensor)}: unknown datatype {shown(name)}; expected one of {allowed}"
        ) from None


def datatype_of(array: Array) -> Datatype:
    """The OIP datatype that carries a numpy array."""
    if array.dtype.kind in ("O", "S", "U"):
        return Datatype.BYTES
    try:
        return DATATYPES_BY_DTYPE[array.dtype.newbyteorder("=")]
    except KeyError:
        raise InvalidInput(f"numpy dtype {array.dtype} has no Open Inference Protocol datatype") from None


def element_count(shape: Sequence[int]) -> int:
    """Number of elements of a concrete shape (Python ints: no overflow for huge declared shapes)."""
    return math.prod(shape)


@dataclass(frozen=True)
class TensorForm:
    """Another datatype and shape an input is also taken in (an OCR image as UINT8 H x W x C besides its encoded
    BYTES). `batch_axis`: the first dimension counts requests' rows as the spec's own first dimension does."""

    datatype: Datatype
    shape: tuple[int, ...]
    batch_axis: bool = False

    def describe(self) -> str:
        return f"{self.datatype.value}{list(self.shape)}"


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a model: name, datatype and shape (-1 marks a variable dimension). `also`: other
    forms an input is taken in; metadata and the model configuration describe the spec's own form."""

    name: str
    datatype: Datatype
    shape: tuple[int, ...]
    also: tuple[TensorForm, ...] = ()

    def describe(self) -> str:
        return f"{self.datatype.value}{list(self.shape)}"

    @property
    def forms(self) -> tuple[TensorForm, ...]:
        """Every form the input is taken in, its own first."""
        own = TensorForm(self.datatype, self.shape, batch_axis=bool(self.shape) and self.shape[0] == -1)
        return (own, *self.also)


@dataclass(frozen=True)
class ModelSignature:
    """A model's inputs and outputs, in the order the model declares them. A `grouped` model (a task, such as
    OCR) takes many requests side by side but never merges their tensors: each request's outputs are its own, with
    their own number of rows (text lines, not images), so it is never `batched`."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    grouped: bool = False

    def input(self, name: str) -> TensorSpec | None:
        return next((t for t in self.inputs if t.name == name), None)

    def output(self, name: str) -> TensorSpec | None:
        return next((t for t in self.outputs if t.name == name), None)

    @property
    def batched(self) -> bool:
        """Every input and output has a variable leading (batch) dimension: the one rule for "batched", by which
        the batcher may merge requests and the model configuration reports dims without the batch dimension."""
        return not self.grouped and all(t.shape and t.shape[0] == -1 for t in self.inputs + self.outputs)


@dataclass(frozen=True)
class Tensor:
    """A named tensor with its datatype; `data` has the tensor's shape."""

    name: str
    datatype: Datatype
    data: Array

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.data.shape)


class TensorHead(NamedTuple):
    """An input as a request declares it, before its data is decoded (a tuple: one is made per input per request)."""

    name: str
    datatype: Datatype
    shape: tuple[int, ...]


ParameterValue = bool | int | str | float


@dataclass(frozen=True)
class InferRequest:
    """A decoded inference request."""

    model_name: str
    model_version: str
    id: str
    inputs: tuple[Tensor, ...]
    requested_outputs: tuple[str, ...] = ()
    parameters: Mapping[str, ParameterValue] = field(default_factory=dict)


@dataclass(frozen=True)
class InferResponse:
    """The outputs of one request, in the order they are returned."""

    model_name: str
    model_version: str
    id: str
    outputs: tuple[Tensor, ...]
    parameters: Mapping[str, ParameterValue] = field(default_factory=dict)
