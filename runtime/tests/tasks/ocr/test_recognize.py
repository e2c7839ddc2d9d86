"""Recognition: crops grouped into width buckets, CTC decoding with the dictionary, direction turns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from skiff_runtime.errors import ModelLoadError
from skiff_runtime.tasks.ocr.classify import classifier_input, turn_upside_down
from skiff_runtime.tasks.ocr.recognize import Dictionary, ctc_decode, group_by_width, recognizer_input, width_bucket

DICTIONARY = Dictionary(("", "a", "b", "中", " "))


def one_hot(*steps: tuple[int, float]) -> np.ndarray:
    """1 x T x 5 probabilities: step t has class steps[t][0] at probability steps[t][1]."""
    out = np.zeros((1, len(steps), len(DICTIONARY.characters)), np.float32)
    for t, (index, p) in enumerate(steps):
        out[0, t, :] = (1 - p) / (out.shape[2] - 1)
        out[0, t, index] = p
    return out


def crop(height: int, width: int) -> np.ndarray:
    return np.zeros((height, width, 3), np.uint8)


def test_ctc_merges_repeats_drops_blanks_and_averages_the_kept_steps() -> None:
    probs = one_hot((1, 0.9), (1, 0.8), (0, 0.99), (1, 0.7), (3, 0.6), (4, 0.5), (2, 1.0))
    [(text, score)] = ctc_decode(probs, DICTIONARY)
    assert text == "aa中 b"  # a a -> a; blank separates the second a; space is the last class
    assert score == pytest.approx(np.mean([0.9, 0.7, 0.6, 0.5, 1.0]), abs=1e-6)


def test_all_blank_decodes_to_empty_text_with_score_zero() -> None:
    assert ctc_decode(one_hot((0, 0.9), (0, 0.9)), DICTIONARY) == [("", 0.0)]


def test_a_dictionary_that_does_not_fit_the_model_is_refused() -> None:
    with pytest.raises(ModelLoadError, match="the recognizer has 6 classes and the dictionary 5"):
        ctc_decode(np.zeros((1, 3, 6), np.float32), DICTIONARY)


def test_dictionary_read_adds_blank_first_and_space_last(tmp_path: Path) -> None:
    path = tmp_path / "keys.txt"
    path.write_bytes("a\r\nb\n\u2028\n中\n".encode())  # CRLF tolerated; U+2028 is a character, not a line end
    assert Dictionary.read(path).characters == ("", "a", "b", "\u2028", "中", " ")


def test_an_unreadable_dictionary_says_so(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="give a UTF-8 file"):
        Dictionary.read(tmp_path / "absent.txt")


@pytest.mark.parametrize(
    ("shape", "step", "width"),
    [((48, 100), 1, 320), ((48, 500), 1, 500), ((24, 250), 1, 500), ((48, 500), 32, 512), ((48, 321), 32, 352)],
)
def test_width_bucket_is_the_width_at_48_high_at_least_320_rounded_up(
    shape: tuple[int, int], step: int, width: int
) -> None:
    assert width_bucket(crop(*shape), step) == width


def test_crops_of_one_bucket_share_a_call_up_to_the_batch_size() -> None:
    crops = [crop(48, 100), crop(48, 700), crop(48, 50), crop(48, 690), crop(48, 200)]
    assert group_by_width(crops, 32, 2) == [(320, [0, 2]), (320, [4]), (704, [1, 3])]
    assert group_by_width(crops, 1, 16) == [(320, [0, 2, 4]), (690, [3]), (700, [1])]


def test_recognizer_input_pads_each_crop_to_the_bucket_width() -> None:
    batch = recognizer_input([np.full((48, 96, 3), 255, np.uint8)], 320)
    assert batch.shape == (1, 3, 48, 320)
    assert (batch[0, :, :, :96] == 1.0).all()
    assert (batch[0, :, :, 96:] == 0.0).all()


def test_only_confident_upside_down_crops_are_turned() -> None:
    image = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    probs = np.array([[0.05, 0.95], [0.2, 0.8], [0.99, 0.01]], np.float32)
    turned, unsure, upright = turn_upside_down([image, image, image], probs, 0.9)
    np.testing.assert_array_equal(turned, image[::-1, ::-1])
    np.testing.assert_array_equal(unsure, image)
    np.testing.assert_array_equal(upright, image)
    assert classifier_input([image, crop(10, 1000)]).shape == (2, 3, 48, 192)
