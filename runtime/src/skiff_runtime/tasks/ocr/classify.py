"""Text direction: crops -> the classifier's fixed 3 x 48 x 192 input; its scores -> which crops to turn 180 degrees."""

from __future__ import annotations

import math

import cv2
import numpy as np

from skiff_runtime.tasks.ocr.detect import Floats
from skiff_runtime.tasks.ocr.images import Image

CLS_SHAPE = (3, 48, 192)
LABELS = ("0", "180")
UPSIDE_DOWN = LABELS.index("180")


def resized_and_padded(crop: Image, height: int, width: int) -> Floats:
    """3 x height x width float32 in [-1, 1]: the crop scaled to the height, at most width wide, zero-padded right."""
    resized_w = min(width, math.ceil(height * crop.shape[1] / float(crop.shape[0])))
    resized = cv2.resize(crop, (resized_w, height)).astype(np.float32)
    padded = np.zeros((3, height, width), np.float32)
    padded[:, :, :resized_w] = (resized.transpose(2, 0, 1) / 255 - 0.5) / 0.5
    return padded


def classifier_input(crops: list[Image]) -> Floats:
    """N x 3 x 48 x 192: every crop fits one shape, so any crops batch together."""
    _, height, width = CLS_SHAPE
    return np.stack([resized_and_padded(crop, height, width) for crop in crops]).astype(np.float32)


def turn_upside_down(crops: list[Image], probabilities: Floats, thresh: float) -> list[Image]:
    """The crops, each turned 180 degrees where the classifier says so with more than thresh confidence."""
    labels = probabilities.argmax(axis=1)
    turned = [label == UPSIDE_DOWN and row[label] > thresh for label, row in zip(labels, probabilities, strict=True)]
    return [
        np.ascontiguousarray(cv2.rotate(crop, cv2.ROTATE_180)) if turn else crop
        for crop, turn in zip(crops, turned, strict=True)
    ]
