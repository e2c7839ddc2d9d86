"""The ocr task's input: encoded images and arrays decode to BGR; budgets and bad bytes are refused before decoding."""

from __future__ import annotations

import struct
import zlib

import cv2
import numpy as np
import pytest

from skiff_runtime.tasks.ocr.images import ImageBudget, header_size, read_images
from skiff_runtime.tasks.task import TaskInputError

# A 3 x 4 image: red on the left half, blue on the right (RGB).
RGB = np.zeros((3, 4, 3), np.uint8)
RGB[:, :2] = (255, 0, 0)
RGB[:, 2:] = (0, 0, 255)
BGR = RGB[:, :, ::-1]


def encoded(ext: str, image: np.ndarray = BGR) -> bytes:
    ok, data = cv2.imencode(ext, np.ascontiguousarray(image))
    assert ok
    return data.tobytes()


def png_claiming(height: int, width: int) -> bytes:
    """A PNG whose header (with a valid CRC) claims height x width but holds almost nothing."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return b"\x89PNG\r\n\x1a\n" + chunk + encoded(".png")[33:]


def as_bytes_tensor(*items: bytes) -> np.ndarray:
    return np.array(list(items), dtype=object)


@pytest.mark.parametrize("ext", [".png", ".jpg"])
def test_header_size_reads_png_and_jpeg_without_decoding(ext: str) -> None:
    assert header_size(encoded(ext, np.zeros((37, 91, 3), np.uint8)), 0) == (37, 91)


def test_png_decodes_to_bgr() -> None:
    [image] = read_images(as_bytes_tensor(encoded(".png")), ImageBudget())
    np.testing.assert_array_equal(image, BGR)


def test_an_rgb_array_becomes_bgr_and_grey_becomes_three_channels() -> None:
    [image] = read_images(RGB, ImageBudget())
    np.testing.assert_array_equal(image, BGR)
    [grey] = read_images(np.full((2, 2, 1), 7, np.uint8), ImageBudget())
    assert grey.shape == (2, 2, 3)
    assert (grey == 7).all()


def test_a_batch_of_arrays_and_a_batch_of_bytes_give_one_image_each() -> None:
    assert len(read_images(np.stack([RGB, RGB, RGB]), ImageBudget())) == 3
    assert len(read_images(as_bytes_tensor(encoded(".png"), encoded(".jpg")), ImageBudget())) == 2


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"GIF89a" + b"\0" * 40, "not a PNG or JPEG"),
        (b"", "not a PNG or JPEG"),
        (encoded(".png")[:40], "do not decode"),  # a whole header, a cut body
    ],
    ids=["gif", "empty", "truncated"],
)
def test_bad_bytes_are_refused_with_what_to_send(data: bytes, message: str) -> None:
    with pytest.raises(TaskInputError, match=message):
        read_images(as_bytes_tensor(encoded(".png"), data), ImageBudget())


def test_an_image_over_the_pixel_budget_is_refused_from_its_header() -> None:
    # 60,000 x 60,000 would be 10 GiB decoded: refused before any decoding, and the error says what to do.
    with pytest.raises(TaskInputError, match=r"image 0 is 60000 x 60000 = 3,600,000,000 pixels.*scale it down"):
        read_images(as_bytes_tensor(png_claiming(60_000, 60_000)), ImageBudget())
    assert len(read_images(as_bytes_tensor(encoded(".png")), ImageBudget(max_pixels=12))) == 1  # 3 x 4 fits


def test_an_array_over_the_pixel_budget_is_refused() -> None:
    with pytest.raises(TaskInputError, match="over the budget of 11"):
        read_images(RGB, ImageBudget(max_pixels=11))


def test_an_image_over_the_byte_budget_is_refused() -> None:
    data = encoded(".png")
    with pytest.raises(TaskInputError, match=f"{len(data)} bytes, over the budget of {len(data) - 1}"):
        read_images(as_bytes_tensor(data), ImageBudget(max_image_bytes=len(data) - 1))
    assert read_images(as_bytes_tensor(data), ImageBudget(max_image_bytes=len(data)))


def test_too_many_images_are_refused_and_the_limit_itself_is_allowed() -> None:
    with pytest.raises(TaskInputError, match="3 images, over the budget of 2"):
        read_images(np.stack([RGB] * 3), ImageBudget(max_images=2))
    assert len(read_images(np.stack([RGB] * 2), ImageBudget(max_images=2))) == 2


@pytest.mark.parametrize(
    "array",
    [np.zeros((4, 4, 3), np.float32), np.zeros((4, 4), np.uint8), np.zeros((4, 4, 4), np.uint8), np.zeros(0, object)],
    ids=["float", "no-channels", "rgba", "empty-bytes"],
)
def test_other_tensors_are_refused_with_the_accepted_forms(array: np.ndarray) -> None:
    with pytest.raises(TaskInputError, match="send"):
        read_images(array, ImageBudget())


def test_a_non_bytes_element_is_refused() -> None:
    with pytest.raises(TaskInputError, match="image 0 is a str, not bytes"):
        read_images(np.array(["x"], dtype=object), ImageBudget())
