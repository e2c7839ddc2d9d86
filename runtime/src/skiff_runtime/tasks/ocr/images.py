"""The ocr task's input: PNG/JPEG bytes or UINT8 HWC arrays -> BGR images, within byte, pixel and count budgets."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

import cv2
import numpy as np
import numpy.typing as npt

from skiff_runtime.tasks.task import TaskInputError
from skiff_runtime.tensors import Array

Image = npt.NDArray[np.uint8]  # H x W x 3, BGR (OpenCV's and PaddleOCR's order)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
JPEG_START = b"\xff\xd8"
# JPEG start-of-frame markers (they carry the size): C0-CF except DHT (C4), JPG (C8) and DAC (CC).
JPEG_FRAME_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Markers with no length field: TEM, RST0-7, SOI, EOI.
JPEG_BARE_MARKERS = frozenset({0x01, *range(0xD0, 0xDA)})
CHANNELS = (1, 3)


@dataclass(frozen=True)
class ImageBudget:
    """What one request may ask of the task before any model runs."""

    max_images: int = 16
    max_image_bytes: int = 16 * 2**20
    max_pixels: int = 25_000_000  # per image, decoded: a 5000 x 5000 scan


def header_size(data: bytes, index: int) -> tuple[int, int]:
    """(height, width) from a PNG or JPEG header, read before decoding; TaskInputError for anything else."""
    if data.startswith(PNG_SIGNATURE) and len(data) >= 24 and data[12:16] == b"IHDR":
        width, height = struct.unpack(">II", data[16:24])
        return height, width
    if data.startswith(JPEG_START):
        size = _jpeg_frame_size(data)
        if size is not None:
            return size
    raise TaskInputError(
        f"image {index}: {len(data)} bytes that are not a PNG or JPEG image (starts {data[:8].hex()}): send PNG or "
        "JPEG bytes, or a UINT8 H x W x 3 RGB tensor"
    )


def _jpeg_frame_size(data: bytes) -> tuple[int, int] | None:
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in JPEG_BARE_MARKERS:
            at += 2
            continue
        (length,) = struct.unpack(">H", data[at + 2 : at + 4])
        if marker in JPEG_FRAME_MARKERS and at + 9 <= len(data):
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return height, width
        at += 2 + length
    return None


def _check_pixels(index: int, height: int, width: int, budget: ImageBudget) -> None:
    if height < 1 or width < 1:
        raise TaskInputError(f"image {index} is {height} x {width} pixels: send an image with at least one pixel")
    if height * width > budget.max_pixels:
        raise TaskInputError(
            f"image {index} is {height} x {width} = {height * width:,} pixels, over the budget of "
            f"{budget.max_pixels:,}: scale it down (text stays readable at 2000 pixels a side) or split it"
        )


def decode_encoded(data: bytes, index: int, budget: ImageBudget) -> Image:
    """One PNG or JPEG as BGR, its size checked from the header before it is decoded."""
    if len(data) > budget.max_image_bytes:
        raise TaskInputError(
            f"image {index} is {len(data):,} bytes, over the budget of {budget.max_image_bytes:,}: "
            "send a smaller or more compressed image"
        )
    height, width = header_size(data, index)
    _check_pixels(index, height, width, budget)
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if image is None:
        raise TaskInputError(f"image {index}: the {len(data)} bytes do not decode as PNG or JPEG: send a whole image")
    return np.ascontiguousarray(image, dtype=np.uint8)


def from_array(array: Array, index: int, budget: ImageBudget) -> Image:
    """One H x W x C (C 1 or 3, RGB) UINT8 array as BGR."""
    height, width, channels = array.shape
    _check_pixels(index, height, width, budget)
    if channels == 1:
        return np.ascontiguousarray(cv2.cvtColor(np.asarray(array, np.uint8), cv2.COLOR_GRAY2BGR), dtype=np.uint8)
    return np.ascontiguousarray(array[:, :, ::-1], dtype=np.uint8)


def _elements(array: Array) -> Iterator[object]:
    return iter(array.reshape(-1))


def read_images(array: Array, budget: ImageBudget) -> list[Image]:
    """The request's images from its `image` tensor: BYTES (one encoded image per element, any shape) or UINT8
    (H x W x C, or N x H x W x C for N images of one size)."""
    if array.dtype.kind in ("O", "S"):
        count = array.size
        _check_count(count, budget)
        images = []
        for index, element in enumerate(_elements(array)):
            if not isinstance(element, bytes | np.bytes_):
                raise TaskInputError(f"image {index} is a {type(element).__name__}, not bytes: send encoded images")
            images.append(decode_encoded(bytes(element), index, budget))
        return images
    if array.dtype == np.uint8 and array.ndim in (3, 4) and array.shape[-1] in CHANNELS:
        batch = array if array.ndim == 4 else array[np.newaxis]
        _check_count(batch.shape[0], budget)
        return [from_array(batch[index], index, budget) for index in range(batch.shape[0])]
    raise TaskInputError(
        f"input 'image' is {array.dtype} with shape {list(array.shape)}: send BYTES (PNG or JPEG, one per element) "
        "or UINT8 shaped H x W x 3 or N x H x W x 3 (RGB; 1 channel for grey)"
    )


def _check_count(count: int, budget: ImageBudget) -> None:
    if count < 1:
        raise TaskInputError("input 'image' holds no image: send at least one")
    if count > budget.max_images:
        raise TaskInputError(
            f"input 'image' holds {count} images, over the budget of {budget.max_images} a request: "
            "split them over several requests"
        )
