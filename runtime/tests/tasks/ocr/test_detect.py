"""Detection's pre- and post-processing: sides multiple of 32 within the max side; DB maps to boxes, by the knobs."""

from __future__ import annotations

import numpy as np
import pytest

from skiff_runtime.tasks.ocr.detect import (
    DetectOptions,
    boxes_from_probability,
    detector_input,
    prepare,
    reading_order,
    to_original,
)


def probability_map(height: int, width: int, *rects: tuple[int, int, int, int, float]) -> np.ndarray:
    """A map with each (x0, y0, x1, y1, p) rectangle at probability p, zero elsewhere."""
    out = np.zeros((height, width), np.float32)
    for x0, y0, x1, y1, p in rects:
        out[y0:y1, x0:x1] = p
    return out


@pytest.mark.parametrize(
    ("shape", "max_side", "expected"),
    [((100, 700), 960, (96, 704)), ((1200, 3000), 960, (384, 960)), ((40, 40), 960, (32, 32))],
)
def test_detector_input_is_normalised_nchw_with_sides_multiple_of_32(
    shape: tuple[int, int], max_side: int, expected: tuple[int, int]
) -> None:
    image = np.full((*shape, 3), 255, np.uint8)
    image[0, 0] = 0
    tensor = detector_input(image, max_side)
    assert tensor.shape == (1, 3, *expected)
    assert tensor.dtype == np.float32
    assert tensor.max() == pytest.approx(1.0)
    assert tensor.min() >= -1.0


def test_prepare_pads_a_flat_line_and_maps_boxes_back_to_the_original() -> None:
    line = np.full((20, 400, 3), 255, np.uint8)  # 20 high: under min_height, so padded top and bottom
    prepared = prepare(line, DetectOptions())
    assert prepared.image.shape[0] > 20
    assert prepared.pad_top > 0
    box = np.array([[[10, prepared.pad_top + 2], [50, prepared.pad_top + 2], [50, 900], [10, 900]]], np.float32)
    back = to_original(box, prepared)
    assert back[0, 0, 1] == pytest.approx(2 * prepared.ratio_h)
    assert back[0, 2, 1] == 20  # clipped to the original image


def test_a_text_region_becomes_one_box_grown_by_the_unclip_ratio() -> None:
    # A 200 x 20 kernel at 0.9 in a 320 x 96 map of a 320 x 96 image.
    prob = probability_map(96, 320, (50, 40, 250, 60, 0.9))
    [box] = boxes_from_probability(prob, (96, 320), DetectOptions())
    assert box[0, 0] < 50
    assert box[1, 0] > 250
    assert box[0, 1] < 40
    assert box[3, 1] > 60
    [tight] = boxes_from_probability(prob, (96, 320), DetectOptions(unclip_ratio=0.5))
    assert (tight[1, 0] - tight[0, 0]) < (box[1, 0] - box[0, 0])


def test_box_thresh_drops_faint_regions_and_keeps_confident_ones() -> None:
    prob = probability_map(96, 320, (20, 10, 150, 30, 0.9), (20, 60, 150, 80, 0.4))
    assert len(boxes_from_probability(prob, (96, 320), DetectOptions(box_thresh=0.5))) == 1
    assert len(boxes_from_probability(prob, (96, 320), DetectOptions(box_thresh=0.35))) == 2


def test_boxes_scale_to_the_image_the_map_was_computed_for() -> None:
    prob = probability_map(96, 320, (50, 40, 250, 60, 0.9))
    [small] = boxes_from_probability(prob, (96, 320), DetectOptions())
    [large] = boxes_from_probability(prob, (192, 640), DetectOptions())
    np.testing.assert_allclose(large, small * 2, atol=2)


def test_an_empty_map_gives_no_boxes() -> None:
    assert boxes_from_probability(np.zeros((64, 64), np.float32), (64, 64), DetectOptions()).shape == (0, 4, 2)


def test_reading_order_is_top_to_bottom_then_left_to_right_within_a_line() -> None:
    def box(x: float, y: float) -> np.ndarray:
        return np.array([[x, y], [x + 10, y], [x + 10, y + 5], [x, y + 5]], np.float32)

    right_high, left_low, next_line = box(100, 10), box(0, 14), box(0, 40)
    ordered = reading_order(np.stack([next_line, right_high, left_low]))
    np.testing.assert_array_equal(ordered, np.stack([left_low, right_high, next_line]))
