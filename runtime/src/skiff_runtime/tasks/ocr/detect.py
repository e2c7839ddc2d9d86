"""Text detection's pre- and post-processing: image -> DB model input, probability map -> quadrilateral boxes.

The steps and constants follow PaddleOCR's (as RapidOCR 1.4.5 packages them) so that boxes match its pipeline on
the same weights: scale sides into [min_side, max_side], pad very flat or very short images top and bottom, resize
for the detector to sides that are multiples of 32, normalise to [-1, 1]; then threshold the map, find contours,
score each minimum-area rectangle on the map, grow it by the unclip ratio (Vatti offsetting), and map it back.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np
import numpy.typing as npt
import pyclipper

from skiff_runtime.tasks.ocr.images import Image

Floats = npt.NDArray[np.float32]
Boxes = npt.NDArray[np.float32]  # N x 4 x 2: top-left, top-right, bottom-right, bottom-left; x then y

DET_MULTIPLE = 32
MIN_BOX_SIDE = 3
DILATION_KERNEL = np.ones((2, 2), np.uint8)
NORM_MEAN = np.array([0.5, 0.5, 0.5])
NORM_STD = np.array([0.5, 0.5, 0.5])


@dataclass(frozen=True)
class DetectOptions:
    """The detector's knobs (PaddleOCR's names in brackets)."""

    max_side: int = 960  # det_limit_side_len with det_limit_type "max": the detector sees at most this many pixels
    thresh: float = 0.3  # det_db_thresh: a pixel is text above this probability
    box_thresh: float = 0.5  # det_db_box_thresh: a box is kept when its mean probability is at least this
    unclip_ratio: float = 1.6  # det_db_unclip_ratio: how far a box grows past the shrunk text kernel
    max_candidates: int = 1000
    image_max_side: int = 2000  # the whole image is scaled down to this first
    image_min_side: int = 30  # ... and up to this
    min_height: int = 30  # images this short or flatter than flat_ratio are padded top and bottom
    flat_ratio: float = 8.0


@dataclass(frozen=True)
class Prepared:
    """An image made ready for the detector, with what maps its boxes back to the original."""

    image: Image  # scaled and padded: crops are cut from it
    model_input: Floats  # 1 x 3 x H x W
    ratio_h: float
    ratio_w: float
    pad_top: int
    original_hw: tuple[int, int]


def _resize_to_multiple(image: Image, ratio: float) -> Image:
    height, width = image.shape[:2]
    new_h = round(int(height * ratio) / DET_MULTIPLE) * DET_MULTIPLE
    new_w = round(int(width * ratio) / DET_MULTIPLE) * DET_MULTIPLE
    if new_h <= 0 or new_w <= 0:
        new_h, new_w = max(new_h, DET_MULTIPLE), max(new_w, DET_MULTIPLE)
    return np.asarray(cv2.resize(image, (new_w, new_h)), np.uint8)


def scale_image(image: Image, options: DetectOptions) -> tuple[Image, float, float]:
    """The image scaled into [image_min_side, image_max_side] (sides rounded to 32), and original/scaled ratios."""
    height, width = image.shape[:2]
    ratio_h = ratio_w = 1.0
    if max(height, width) > options.image_max_side:
        image = _resize_to_multiple(image, options.image_max_side / max(height, width))
        ratio_h, ratio_w = height / image.shape[0], width / image.shape[1]
    height, width = image.shape[:2]
    if min(height, width) < options.image_min_side:
        image = _resize_to_multiple(image, options.image_min_side / min(height, width))
        ratio_h, ratio_w = height / image.shape[0], width / image.shape[1]
    return image, ratio_h, ratio_w


def pad_height(height: int, width: int, options: DetectOptions) -> int:
    """Rows of black added above and below a short or very flat image, so the detector sees context."""
    if height > options.min_height and width / height <= options.flat_ratio:
        return 0
    target = max(int(width / options.flat_ratio), options.min_height) * 2
    return int(abs(target - height) / 2)


def detector_input(image: Image, max_side: int) -> Floats:
    """1 x 3 x H x W float32, sides multiples of 32 and at most about max_side, normalised to [-1, 1]."""
    height, width = image.shape[:2]
    ratio = max_side / max(height, width) if max(height, width) > max_side else 1.0
    resized = _resize_to_multiple(image, ratio)
    normalised = (resized.astype(np.float32) * (1 / 255.0) - NORM_MEAN) / NORM_STD  # in float64, as PaddleOCR
    return np.ascontiguousarray(normalised.transpose(2, 0, 1)[np.newaxis], np.float32)


def prepare(image: Image, options: DetectOptions) -> Prepared:
    """Everything before the detector runs."""
    original_hw = (int(image.shape[0]), int(image.shape[1]))
    scaled, ratio_h, ratio_w = scale_image(image, options)
    pad = pad_height(scaled.shape[0], scaled.shape[1], options)
    if pad:
        scaled = np.asarray(cv2.copyMakeBorder(scaled, pad, pad, 0, 0, cv2.BORDER_CONSTANT, value=(0, 0, 0)))
    return Prepared(scaled, detector_input(scaled, options.max_side), ratio_h, ratio_w, pad, original_hw)


def _mini_box(contour: cv2.typing.MatLike) -> tuple[Floats, float]:
    rect = cv2.minAreaRect(contour)
    points = sorted(cv2.boxPoints(rect).tolist(), key=lambda p: p[0])
    left = (points[0], points[1]) if points[1][1] > points[0][1] else (points[1], points[0])
    right = (points[2], points[3]) if points[3][1] > points[2][1] else (points[3], points[2])
    box = np.array([left[0], right[0], right[1], left[1]], np.float32)
    return box, float(min(rect[1]))


def _box_score(probability: Floats, box: Floats) -> float:
    height, width = probability.shape
    xmin = int(np.clip(np.floor(box[:, 0].min()), 0, width - 1))
    xmax = int(np.clip(np.ceil(box[:, 0].max()), 0, width - 1))
    ymin = int(np.clip(np.floor(box[:, 1].min()), 0, height - 1))
    ymax = int(np.clip(np.ceil(box[:, 1].max()), 0, height - 1))
    mask = np.zeros((ymax - ymin + 1, xmax - xmin + 1), np.uint8)
    shifted = box - np.array([xmin, ymin], np.float32)
    cv2.fillPoly(mask, [shifted.reshape(-1, 2).astype(np.int32)], 1)
    return float(cv2.mean(probability[ymin : ymax + 1, xmin : xmax + 1], mask)[0])


def _unclip(box: Floats, ratio: float) -> npt.NDArray[np.int64]:
    points = box.astype(np.float64)
    x, y = points[:, 0], points[:, 1]
    area = abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1)))) / 2
    length = float(np.linalg.norm(points - np.roll(points, -1, axis=0), axis=1).sum())
    offset = pyclipper.PyclipperOffset()
    offset.AddPath(box.tolist(), pyclipper.JT_ROUND, pyclipper.ET_CLOSEDPOLYGON)
    return np.array(offset.Execute(area * ratio / length)).reshape((-1, 1, 2))


def boxes_from_probability(probability: Floats, image_hw: tuple[int, int], options: DetectOptions) -> Boxes:
    """DB post-processing of one H x W map into boxes in the coordinates of an image of image_hw."""
    height, width = probability.shape
    dest_h, dest_w = image_hw
    mask = cv2.dilate((probability > options.thresh).astype(np.uint8), DILATION_KERNEL)
    contours, _ = cv2.findContours((mask * 255).astype(np.uint8), cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
    boxes = []
    for contour in contours[: options.max_candidates]:
        points, side = _mini_box(contour)
        if side < MIN_BOX_SIDE or _box_score(probability, points) < options.box_thresh:
            continue
        grown = _unclip(points, options.unclip_ratio)
        if grown.size == 0:
            continue
        box, side = _mini_box(grown)
        if side < MIN_BOX_SIDE + 2:
            continue
        box[:, 0] = np.clip(np.round(box[:, 0] / width * dest_w), 0, dest_w)
        box[:, 1] = np.clip(np.round(box[:, 1] / height * dest_h), 0, dest_h)
        boxes.append(box.astype(np.int32))
    return _kept_boxes(boxes, image_hw)


def _clockwise(box: npt.NDArray[np.int32]) -> Floats:
    by_x = box[np.argsort(box[:, 0], kind="stable")]
    left = by_x[:2][np.argsort(by_x[:2, 1], kind="stable")]
    right = by_x[2:][np.argsort(by_x[2:, 1], kind="stable")]
    return np.array([left[0], right[0], right[1], left[1]], np.float32)


def _kept_boxes(boxes: list[npt.NDArray[np.int32]], image_hw: tuple[int, int]) -> Boxes:
    """Corners in clockwise order, clipped to the image; boxes 3 pixels or thinner dropped."""
    height, width = image_hw
    kept = []
    for raw in boxes:
        box = _clockwise(raw)
        box[:, 0] = np.clip(box[:, 0], 0, width - 1).astype(np.int32)
        box[:, 1] = np.clip(box[:, 1], 0, height - 1).astype(np.int32)
        if int(np.linalg.norm(box[0] - box[1])) <= MIN_BOX_SIDE or int(np.linalg.norm(box[0] - box[3])) <= MIN_BOX_SIDE:
            continue
        kept.append(box)
    return np.array(kept, np.float32).reshape(-1, 4, 2)


def reading_order(boxes: Boxes) -> Boxes:
    """Top to bottom, then left to right within a line (boxes whose tops are within 10 pixels)."""
    ordered = sorted(boxes, key=lambda b: (float(b[0][1]), float(b[0][0])))
    for i in range(len(ordered) - 1):
        for j in range(i, -1, -1):
            if abs(ordered[j + 1][0][1] - ordered[j][0][1]) < 10 and ordered[j + 1][0][0] < ordered[j][0][0]:
                ordered[j], ordered[j + 1] = ordered[j + 1], ordered[j]
            else:
                break
    return np.array(ordered, np.float32).reshape(-1, 4, 2)


def to_original(boxes: Boxes, prepared: Prepared) -> Boxes:
    """Boxes in the scaled, padded image -> in the original image, clipped to it."""
    out = boxes.astype(np.float32).copy()
    out[:, :, 1] -= prepared.pad_top
    out[:, :, 0] *= prepared.ratio_w
    out[:, :, 1] *= prepared.ratio_h
    height, width = prepared.original_hw
    out = np.maximum(out, 0)
    out[..., 0] = np.minimum(out[..., 0], width)
    out[..., 1] = np.minimum(out[..., 1], height)
    return out
