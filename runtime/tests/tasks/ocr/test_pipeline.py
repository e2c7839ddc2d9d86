"""The ocr task on the real PP-OCRv4 weights: equal to RapidOCR's pipeline line for line, and reads rendered text."""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from bench.ocr.samples import Sample
from PIL import Image

from skiff_runtime.tasks.ocr.images import ImageBudget
from skiff_runtime.tasks.ocr.pipeline import OcrOptions, OcrTask
from skiff_runtime.tasks.ocr.recognize import Dictionary
from skiff_runtime.tasks.task import Engine, TaskInputError, run_task, run_together
from skiff_runtime.tensors import Array

pytestmark = [pytest.mark.paddle, pytest.mark.slow]

SAMPLES = ["english", "chinese", "id-card"]


class Counted:
    """Engines that record which sub-model each call went to, and its batch size."""

    def __init__(self, engines: Mapping[str, Engine]) -> None:
        self.calls: list[tuple[str, int]] = []
        self.engines = {name: self._wrap(name, engine) for name, engine in engines.items()}

    def _wrap(self, name: str, engine: Engine) -> Engine:
        def run(inputs: Mapping[str, Array]) -> Mapping[str, Array]:
            self.calls.append((name, len(next(iter(inputs.values())))))
            return engine(inputs)

        return run


def encoded(*items: bytes) -> dict[str, np.ndarray]:
    return {"image": np.array(list(items), dtype=object)}


def texts(outputs: dict[str, np.ndarray]) -> list[str]:
    return [text.decode() for text in outputs["texts"]]


def unspaced(lines: list[str] | tuple[str, ...]) -> list[str]:
    return [line.replace(" ", "") for line in lines]


@pytest.mark.parametrize("name", SAMPLES)
def test_texts_boxes_and_scores_equal_the_reference_pipeline(
    name: str, rendered: dict[str, Sample], dictionary: Dictionary, ocr_engines: dict[str, Engine], reference: Any
) -> None:
    sample = rendered[name]
    expected, _ = reference(sample.png)
    out = run_task(OcrTask(dictionary), encoded(sample.png), ocr_engines)
    assert texts(out) == [line[1] for line in expected]
    assert out["boxes"].shape == (len(expected), 4, 2)
    assert out["boxes"].dtype == np.float32
    np.testing.assert_allclose(out["boxes"], np.array([line[0] for line in expected], np.float32), atol=2)
    np.testing.assert_allclose(out["scores"], [line[2] for line in expected], atol=1e-3)
    assert (out["image_index"] == 0).all()


@pytest.mark.parametrize("name", ["chinese", "id-card"])
def test_rendered_chinese_reads_as_drawn(
    name: str, rendered: dict[str, Sample], dictionary: Dictionary, ocr_engines: dict[str, Engine]
) -> None:
    # The recogniser drops the spaces between Chinese words; every character is read.
    sample = rendered[name]
    out = run_task(OcrTask(dictionary), encoded(sample.png), ocr_engines)
    assert unspaced(texts(out)) == unspaced(sample.lines)


def test_an_rgb_array_reads_as_its_encoded_image(
    rendered: dict[str, Sample], dictionary: Dictionary, ocr_engines: dict[str, Engine]
) -> None:
    sample = rendered["chinese"]
    from_png = run_task(OcrTask(dictionary), encoded(sample.png), ocr_engines)
    from_array = run_task(OcrTask(dictionary), {"image": sample.rgb()}, ocr_engines)
    assert texts(from_array) == texts(from_png)
    np.testing.assert_array_equal(from_array["boxes"], from_png["boxes"])


def test_a_batch_of_images_runs_detection_once_per_size_and_tags_each_line(
    rendered: dict[str, Sample], dictionary: Dictionary, ocr_engines: dict[str, Engine]
) -> None:
    chinese, card = rendered["chinese"], rendered["id-card"]
    counted = Counted(ocr_engines)
    out = run_task(OcrTask(dictionary), encoded(chinese.png, card.png, chinese.png), counted.engines)
    alone = texts(run_task(OcrTask(dictionary), encoded(card.png), ocr_engines))
    assert out["image_index"].tolist() == [0] * 3 + [1] * 5 + [2] * 3
    assert texts(out)[3:8] == alone
    # The two same-size images share one detector call; the card has its own; crops of all images share cls calls.
    assert sorted(batch for model, batch in counted.calls if model == "det") == [1, 2]
    assert [batch for model, batch in counted.calls if model == "cls"] == [11]


def test_an_upside_down_image_reads_once_the_classifier_turns_its_lines(
    rendered: dict[str, Sample], dictionary: Dictionary, ocr_engines: dict[str, Engine]
) -> None:
    sample = rendered["id-card"]
    upside_down = np.ascontiguousarray(sample.rgb()[::-1, ::-1])
    read = texts(run_task(OcrTask(dictionary), {"image": upside_down}, ocr_engines))
    assert sorted(unspaced(read)) == sorted(unspaced(sample.lines))
    unturned = texts(
        run_task(OcrTask(dictionary, OcrOptions(use_classifier=False)), {"image": upside_down}, ocr_engines)
    )
    assert not set(unspaced(unturned)) & set(unspaced(sample.lines))


def test_more_lines_than_the_box_budget_are_refused_before_recognition(
    rendered: dict[str, Sample], dictionary: Dictionary, ocr_engines: dict[str, Engine]
) -> None:
    card = rendered["id-card"]  # 5 lines
    counted = Counted(ocr_engines)
    with pytest.raises(TaskInputError, match="more than 4 text lines"):
        run_task(OcrTask(dictionary, OcrOptions(max_boxes=4)), encoded(card.png), counted.engines)
    assert [model for model, _ in counted.calls] == ["det"]
    assert len(texts(run_task(OcrTask(dictionary, OcrOptions(max_boxes=5)), encoded(card.png), ocr_engines))) == 5


@pytest.mark.parametrize(
    ("inputs", "options", "message"),
    [
        (encoded(b"not an image"), OcrOptions(), "not a PNG or JPEG"),
        ({"picture": np.zeros((8, 8, 3), np.uint8)}, OcrOptions(), "reads input 'image'"),
        ({"image": np.zeros((600, 600, 3), np.uint8)}, OcrOptions(budget=ImageBudget(max_pixels=1000)), "pixels"),
    ],
    ids=["bad-bytes", "wrong-name", "pixel-budget"],
)
def test_bad_input_is_refused_before_any_model_runs(
    inputs: dict[str, np.ndarray],
    options: OcrOptions,
    message: str,
    dictionary: Dictionary,
    ocr_engines: dict[str, Engine],
) -> None:
    counted = Counted(ocr_engines)
    with pytest.raises(TaskInputError, match=message):
        run_task(OcrTask(dictionary, options), inputs, counted.engines)
    assert counted.calls == []


def test_a_blank_image_has_no_lines(dictionary: Dictionary, ocr_engines: dict[str, Engine]) -> None:
    blank = io.BytesIO()
    Image.new("RGB", (320, 96), "white").save(blank, "PNG")
    out = run_task(OcrTask(dictionary), encoded(blank.getvalue()), ocr_engines)
    assert out["texts"].shape == (0,)
    assert out["boxes"].shape == (0, 4, 2)
    assert out["image_index"].shape == (0,)


def test_concurrent_requests_share_detector_and_recogniser_calls_and_read_as_alone(
    rendered: dict[str, Sample], dictionary: Dictionary, ocr_engines: dict[str, Engine]
) -> None:
    chinese, card = rendered["chinese"], rendered["id-card"]
    task = OcrTask(dictionary)
    requests = [encoded(chinese.png), encoded(card.png), encoded(b"not an image"), encoded(chinese.png)]
    alone = Counted(ocr_engines)
    expected = [run_task(task, encoded(sample.png), alone.engines) for sample in (chinese, card, chinese)]
    together = Counted(ocr_engines)
    first, second, refused, fourth = run_together(task, requests, together.engines)
    assert isinstance(refused, TaskInputError)
    for outcome, want in zip((first, second, fourth), expected, strict=True):
        assert isinstance(outcome, dict)
        assert texts(outcome) == texts(want)
        np.testing.assert_array_equal(outcome["boxes"], want["boxes"])
    # The two Chinese images' detector inputs and crops have the same shapes: each of their calls is shared.
    assert [batch for model, batch in together.calls if model == "det"] == [2, 1]
    rec_alone = [batch for model, batch in alone.calls if model == "rec"]
    rec_together = [batch for model, batch in together.calls if model == "rec"]
    assert sum(rec_together) == sum(rec_alone)
    assert len(rec_together) < len(rec_alone)
    # As a worker runs it (ServedTask.alone): the detector per request, the classifier and recogniser merged, and
    # every request still reads exactly as alone.
    served = Counted(ocr_engines)
    first, second, refused, fourth = run_together(task, requests, served.engines, alone=("det",))
    assert isinstance(refused, TaskInputError)
    for outcome, want in zip((first, second, fourth), expected, strict=True):
        assert isinstance(outcome, dict)
        assert texts(outcome) == texts(want)
        np.testing.assert_array_equal(outcome["boxes"], want["boxes"])
    assert [batch for model, batch in served.calls if model == "det"] == [1, 1, 1]
    assert len([1 for model, _ in served.calls if model == "rec"]) < len(rec_alone)
