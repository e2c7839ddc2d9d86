"""Cuts each detected box out of the image as an upright text line: perspective warp, tall crops turned."""

from __future__ import annotations

import cv2
import numpy as np

from skiff_runtime.tasks.ocr.detect import Floats
from skiff_runtime.tasks.ocr.images import Image

# A crop this many times taller than wide is a vertical line: turned 90 degrees counter-clockwise.
TALL_RATIO = 1.5


def crop_box(image: Image, box: Floats) -> Image:
    """The quadrilateral box (clockwise from top-left) warped to a rectangle."""
    width = int(max(np.linalg.norm(box[0] - box[1]), np.linalg.norm(box[2] - box[3])))
    height = int(max(np.linalg.norm(box[0] - box[3]), np.linalg.norm(box[1] - box[2])))
    target = np.array([[0, 0], [width, 0], [width, height], [0, height]], np.float32)
    matrix = cv2.getPerspectiveTransform(box.astype(np.float32), target)
    crop = cv2.warpPerspective(image, matrix, (width, height), borderMode=cv2.BORDER_REPLICATE, flags=cv2.INTER_CUBIC)
    if crop.shape[0] / crop.shape[1] >= TALL_RATIO:
        crop = np.rot90(crop)
    return np.ascontiguousarray(crop, np.uint8)
