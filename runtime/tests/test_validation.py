"""The model contract: NOT_FOUND for another model, wire caps from the signature, and every mismatch between a
request's inputs or requested outputs and the signature named in an InvalidInput."""

from __future__ import annotations

import numpy as np
import pytest

from skiff_runtime.errors import InvalidInput, ModelNotFound
from skiff_runtime.tensors import (
    NUMPY_DTYPES,
    Datatype,
    InferRequest,
    ModelSignature,
    Tensor,
    TensorForm,
    TensorHead,
    TensorSpec,
)
from skiff_runtime.validation import SPARE_TENSORS, ModelContract, check_model, request_limits, request_rows

SIGNATURE = ModelSignature(
    inputs=(TensorSpec("x", Datatype.FP32, (-1, 4)), TensorSpec("ids", Datatype.INT64, (-1,))),
    outputs=(TensorSpec("out", Datatype.FP32, (-1, 2)), TensorSpec("aux", Datatype.INT64, (-1,))),
)
MAX_BATCH = 8
CONTRACT = ModelContract(SIGNATURE, MAX_BATCH)


def x_tensor(*shape: int, datatype: Datatype = Datatype.FP32) -> Tensor:
    return Tensor("x", datatype, np.zeros(shape, dtype=NUMPY_DTYPES[datatype]))


def ids_tensor(batch: int) -> Tensor:
    return Tensor("ids", Datatype.INT64, np.zeros(batch, dtype=np.int64))


def infer_request(*inputs: Tensor, outputs: tuple[str, ...] = ()) -> InferRequest:
    return InferRequest("m", "", "", inputs, requested_outputs=outputs)


@pytest.mark.parametrize("batch", [1, MAX_BATCH])
def test_valid_request_passes_validation(batch: int) -> None:
    CONTRACT.check_request(infer_request(x_tensor(batch, 4), ids_tensor(batch), outputs=("aux",)))


INVALID: list[tuple[str, InferRequest, list[str]]] = [
    ("missing-input", infer_request(x_tensor(1, 4)), ["missing input(s) ['ids']", "expects ['x', 'ids']"]),
    (
        "unknown-input",
        infer_request(x_tensor(1, 4), ids_tensor(1), Tensor("z", Datatype.FP32, np.zeros(1, np.float32))),
        ["unknown input 'z'", "expects ['x', 'ids']"],
    ),
    (
        "wrong-datatype",
        infer_request(x_tensor(1, 4, datatype=Datatype.FP64), ids_tensor(1)),
        ["'x'", "expected datatype FP32", "got FP64"],
    ),
    (
        "wrong-rank",
        infer_request(x_tensor(1, 4, 1), ids_tensor(1)),
        ["'x'", "expected rank 2", "[-1, 4]", "got rank 3", "[1, 4, 1]"],
    ),
    (
        "wrong-non-batch-dim",
        infer_request(x_tensor(2, 5), ids_tensor(2)),
        ["'x'", "dimension 1 must be 4", "got 5", "[2, 5]"],
    ),
    (
        "batch-disagreement",
        infer_request(x_tensor(2, 4), ids_tensor(3)),
        ["disagree on the batch dimension", "'x': 2", "'ids': 3"],
    ),
    (
        "batch-over-max",
        infer_request(x_tensor(MAX_BATCH + 1, 4), ids_tensor(MAX_BATCH + 1)),
        [f"batch size {MAX_BATCH + 1}", f"1..{MAX_BATCH}"],
    ),
    ("batch-zero", infer_request(x_tensor(0, 4), ids_tensor(0)), ["batch size 0", f"1..{MAX_BATCH}"]),
    (
        "unknown-requested-output",
        infer_request(x_tensor(1, 4), ids_tensor(1), outputs=("out", "nope")),
        ["unknown requested output 'nope'", "['out', 'aux']"],
    ),
]


@pytest.mark.parametrize(("request_", "fragments"), [i[1:] for i in INVALID], ids=[i[0] for i in INVALID])
def test_request_not_matching_the_signature_is_invalid_input(request_: InferRequest, fragments: list[str]) -> None:
    with pytest.raises(InvalidInput) as info:
        CONTRACT.check_request(request_)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_fixed_batch_dimension_is_not_limited_by_max_batch_size() -> None:
    signature = ModelSignature(
        inputs=(TensorSpec("x", Datatype.FP32, (64, 4)),), outputs=(TensorSpec("y", Datatype.FP32, (64,)),)
    )
    ModelContract(signature, MAX_BATCH).check_request(infer_request(x_tensor(64, 4)))


def test_heads_are_checked_like_decoded_requests() -> None:
    CONTRACT.check_heads([TensorHead("x", Datatype.FP32, (2, 4)), TensorHead("ids", Datatype.INT64, (2,))], ("out",))
    with pytest.raises(InvalidInput, match=r"input 'x': dimension 1 must be 4 \(shape \[-1, 4\]\), got 5"):
        CONTRACT.check_heads([TensorHead("x", Datatype.FP32, (2, 5)), TensorHead("ids", Datatype.INT64, (2,))], ())


@pytest.mark.parametrize(
    ("name", "version", "fragment"),
    [
        ("other", "", "unknown model 'other'; this server serves 'm'"),
        (
            "m",
            "v9",
            "model 'm' has no version 'v9'; it serves version 'v1'; to reach version 'v9', send the header "
            "'skiff-version: <version>' to the model's gateway",
        ),
        ("o" * 500, "", "... (500 characters)"),
    ],
    ids=["model", "version", "long-name"],
)
def test_another_model_or_version_is_not_found(name: str, version: str, fragment: str) -> None:
    check_model("m", "", "m", "v1")
    check_model("m", "v1", "m", "v1")
    with pytest.raises(ModelNotFound) as info:
        check_model(name, version, "m", "v1")
    assert fragment in str(info.value)


def test_wire_caps_follow_the_signature() -> None:
    signature = ModelSignature(
        inputs=(
            TensorSpec("s", Datatype.BYTES, (-1, 3)),
            TensorSpec("fixed", Datatype.BYTES, (2,)),
            TensorSpec("ragged", Datatype.BYTES, (-1, -1)),
            TensorSpec("x", Datatype.FP32, (-1,)),
        ),
        outputs=(TensorSpec("y", Datatype.FP32, (-1,)),),
    )
    limits = request_limits(signature, 4)
    assert (limits.max_inputs, limits.max_outputs) == (4 + SPARE_TENSORS, 1 + SPARE_TENSORS)
    assert limits.hint == "the model takes 4 input(s) and has 1 output(s)"
    # BYTES inputs: their elements at the max batch size; a variable non-batch dimension gets the hard cap.
    assert dict(limits.max_bytes_elements) == {"s": 12, "fixed": 2, "ragged": 1 << 20}
    assert ModelContract(signature, 4).limits == limits


# An input taken in more than one form, as the ocr task's image: encoded BYTES, or UINT8 H x W x C / N x H x W x C.
IMAGE = TensorSpec(
    "image",
    Datatype.BYTES,
    (-1,),
    also=(TensorForm(Datatype.UINT8, (-1, -1, -1)), TensorForm(Datatype.UINT8, (-1, -1, -1, -1), batch_axis=True)),
)
FORMS = ModelSignature(inputs=(IMAGE,), outputs=(TensorSpec("texts", Datatype.BYTES, (-1,)),), grouped=True)


def image(datatype: Datatype, *shape: int) -> InferRequest:
    return infer_request(Tensor("image", datatype, np.zeros(shape, dtype=NUMPY_DTYPES[datatype])))


@pytest.mark.parametrize(
    ("request_", "rows"),
    [(image(Datatype.BYTES, 3), 3), (image(Datatype.UINT8, 540, 856, 3), 1), (image(Datatype.UINT8, 2, 48, 64, 3), 2)],
    ids=["bytes", "uint8-hwc", "uint8-nhwc"],
)
def test_an_input_is_taken_in_each_of_its_forms_and_counts_its_rows_by_the_form(
    request_: InferRequest, rows: int
) -> None:
    ModelContract(FORMS, MAX_BATCH).check_request(request_)  # 540 is no batch size: the H x W x C form has none
    assert request_rows(FORMS, {t.name: t.data for t in request_.inputs}) == rows


@pytest.mark.parametrize(
    ("request_", "fragment"),
    [
        (image(Datatype.FP32, 48, 64, 3), "expected datatype BYTES[-1] or UINT8[-1, -1, -1] or UINT8[-1, -1, -1, -1]"),
        (image(Datatype.UINT8, 48, 64), "expected one of BYTES[-1] or UINT8[-1, -1, -1] or UINT8[-1, -1, -1, -1]"),
        (image(Datatype.BYTES, 2, 2), "expected rank 1 (shape [-1]), got rank 2"),
        (image(Datatype.UINT8, MAX_BATCH + 1, 48, 64, 3), f"batch size {MAX_BATCH + 1} is outside 1..{MAX_BATCH}"),
    ],
    ids=["datatype", "uint8-rank", "bytes-rank", "nhwc-batch"],
)
def test_an_input_in_none_of_its_forms_is_invalid_naming_them(request_: InferRequest, fragment: str) -> None:
    with pytest.raises(InvalidInput) as info:
        ModelContract(FORMS, MAX_BATCH).check_request(request_)
    assert fragment in str(info.value)
