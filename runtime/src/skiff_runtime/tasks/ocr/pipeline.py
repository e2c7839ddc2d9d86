"""The `ocr` task: images -> detection (det) -> direction (cls) -> recognition (rec) -> texts, boxes and scores.

Input `image`: BYTES, one PNG or JPEG per element, or UINT8 H x W x 3 (RGB) / N x H x W x 3. Outputs, one row per
text line of all images, in reading order within each image: `texts` (BYTES, UTF-8), `boxes` (FP32 N x 4 x 2,
corners clockwise from top-left, x then y, in the original image's pixels), `scores` (FP32 N, the recognizer's
mean confidence) and `image_index` (INT32 N, which input image the line is on). Lines scoring under
`text_score` are dropped, as PaddleOCR does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from skiff_runtime.errors import InferenceFailed
from skiff_runtime.tasks.ocr import classify, detect, recognize
from skiff_runtime.tasks.ocr.crops import crop_box
from skiff_runtime.tasks.ocr.images import Image, ImageBudget, read_images
from skiff_runtime.tasks.task import Calls, ModelCall, Steps, TaskInputError
from skiff_runtime.tensors import Array, Datatype, ModelSignature, TensorForm, TensorSpec

INPUT = "image"
MODELS = ("det", "cls", "rec")
MODEL_INPUT = "x"  # every PP-OCR inference model's one input

# What the task serves on every protocol: images in (one PNG or JPEG per element), one row per text line out.
# Grouped: concurrent requests share sub-model calls, but their tensors are never merged (rows are lines).
# The image is also taken decoded, as UINT8 H x W x C (one image) or N x H x W x C (N of one size), RGB or grey:
# read_images checks the channels and the budgets.
SIGNATURE = ModelSignature(
    inputs=(
        TensorSpec(
            INPUT,
            Datatype.BYTES,
            (-1,),
            also=(TensorForm(Datatype.UINT8, (-1, -1, -1)), TensorForm(Datatype.UINT8, (-1, -1, -1, -1), True)),
        ),
    ),
    outputs=(
        TensorSpec("texts", Datatype.BYTES, (-1,)),
        TensorSpec("boxes", Datatype.FP32, (-1, 4, 2)),
        TensorSpec("scores", Datatype.FP32, (-1,)),
        TensorSpec("image_index", Datatype.INT32, (-1,)),
    ),
    grouped=True,
)


@dataclass(frozen=True)
class OcrOptions:
    """The task's knobs, with PaddleOCR's defaults."""

    detect: detect.DetectOptions = field(default_factory=detect.DetectOptions)
    budget: ImageBudget = field(default_factory=ImageBudget)
    max_boxes: int = 500  # text lines a request may hold, all images together: bounds crops and recognizer work
    use_classifier: bool = True
    cls_thresh: float = 0.9  # turn a crop 180 degrees when the classifier is this sure
    cls_batch: int = 16
    rec_batch: int = 16
    # Width buckets: crops are padded up to a multiple of this many pixels. 1 pads each crop as PaddleOCR pads a
    # crop alone (its text equals PaddleOCR's); 32 lets more crops share a batch but moves marginal characters
    # (docs/ocr.md: at 32, 1 of 11 rendered lines read differently).
    rec_width_step: int = 1
    text_score: float = 0.5


def _only_output(outputs: Mapping[str, Array], model: str) -> Array:
    if len(outputs) != 1:
        raise InferenceFailed(f"sub-model {model!r} returned outputs {sorted(outputs)}; the ocr task needs one")
    return next(iter(outputs.values()))


@dataclass(frozen=True)
class OcrTask:
    """PP-OCR's three models behind one call; `dictionary` is the recognizer's."""

    dictionary: recognize.Dictionary
    options: OcrOptions = field(default_factory=OcrOptions)
    name: str = "ocr"
    models: tuple[str, ...] = MODELS

    def steps(self, inputs: Mapping[str, Array]) -> Steps:
        if INPUT not in inputs:
            raise TaskInputError(f"the ocr task reads input {INPUT!r}; got {sorted(inputs)}: name the image tensor")
        images = read_images(inputs[INPUT], self.options.budget)
        prepared = [detect.prepare(image, self.options.detect) for image in images]
        # Detection: images whose detector inputs share a shape run as one batch.
        maps: dict[int, Array] = {}
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for index, item in enumerate(prepared):
            by_shape.setdefault(item.model_input.shape, []).append(index)
        for indices in by_shape.values():
            batch = np.concatenate([prepared[i].model_input for i in indices])
            probabilities = _only_output((yield ModelCall("det", {MODEL_INPUT: batch})), "det")
            for row, index in enumerate(indices):
                maps[index] = probabilities[row, 0]
        crops: list[Image] = []
        boxes: list[Array] = []
        owners: list[int] = []
        for index, item in enumerate(prepared):
            found = detect.boxes_from_probability(
                np.asarray(maps[index], np.float32), item.image.shape[:2], self.options.detect
            )
            ordered = detect.reading_order(found)
            crops.extend(crop_box(item.image, box) for box in ordered)
            boxes.extend(detect.to_original(ordered, item))
            owners.extend([index] * len(ordered))
            if len(crops) > self.options.max_boxes:
                raise TaskInputError(
                    f"the request's images hold more than {self.options.max_boxes} text lines (the box budget): "
                    "send fewer images a request, or crop each to the region you need"
                )
        if self.options.use_classifier:
            crops = yield from self._upright(crops)
        lines = yield from self._recognise(crops)
        keep = [i for i, (_, score) in enumerate(lines) if score >= self.options.text_score]
        return {
            "texts": np.array([lines[i][0].encode() for i in keep], dtype=object),
            "boxes": np.array([boxes[i] for i in keep], np.float32).reshape(-1, 4, 2),
            "scores": np.array([lines[i][1] for i in keep], np.float32),
            "image_index": np.array([owners[i] for i in keep], np.int32),
        }

    def _upright(self, crops: list[Image]) -> Calls[list[Image]]:
        upright: list[Image] = []
        for start in range(0, len(crops), self.options.cls_batch):
            chunk = crops[start : start + self.options.cls_batch]
            batch = classify.classifier_input(chunk)
            probabilities = _only_output((yield ModelCall("cls", {MODEL_INPUT: batch})), "cls")
            upright.extend(classify.turn_upside_down(chunk, np.asarray(probabilities), self.options.cls_thresh))
        return upright

    def _recognise(self, crops: list[Image]) -> Calls[list[tuple[str, float]]]:
        lines: list[tuple[str, float]] = [("", 0.0)] * len(crops)
        for width, indices in recognize.group_by_width(crops, self.options.rec_width_step, self.options.rec_batch):
            batch = recognize.recognizer_input([crops[i] for i in indices], width)
            probabilities = _only_output((yield ModelCall("rec", {MODEL_INPUT: batch})), "rec")
            decoded = recognize.ctc_decode(np.asarray(probabilities, np.float32), self.dictionary)
            for index, line in zip(indices, decoded, strict=True):
                lines[index] = line
        return lines
