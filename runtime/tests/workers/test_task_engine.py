"""The task engine's pure parts: the ocr settings rows become the task's options, and its dictionary is found in
the rec directory or refused with the flag to give (the engine on real weights: tests/server/test_ocr_serving.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from skiff_runtime.errors import ModelLoadError
from skiff_runtime.settings import parse_settings
from skiff_runtime.tasks.ocr.detect import DetectOptions
from skiff_runtime.tasks.ocr.images import ImageBudget
from skiff_runtime.tasks.ocr.pipeline import SIGNATURE, OcrOptions
from skiff_runtime.workers.task_engine import build_ocr, ocr_options


def ocr_settings(model_dir: Path, *args: str):  # type: ignore[no-untyped-def]
    return parse_settings(["--model-dir", str(model_dir), "--model-name", "ocr", "--task", "ocr", *args], env={})


def test_the_ocr_rows_become_the_tasks_options(tmp_path: Path) -> None:
    assert ocr_options(ocr_settings(tmp_path)) == OcrOptions()  # the rows' defaults are PaddleOCR's, as the task's
    flags = ["--ocr-box-thresh", "0.6", "--ocr-unclip-ratio", "2", "--ocr-det-max-side", "1280"]
    flags += ["--ocr-max-images", "4", "--ocr-max-image-mb", "2", "--ocr-max-pixels", "1000", "--ocr-max-boxes", "9"]
    flags += ["--ocr-use-classifier", "false", "--ocr-rec-width-step", "32", "--ocr-text-score", "0.7"]
    assert ocr_options(ocr_settings(tmp_path, *flags)) == OcrOptions(
        detect=DetectOptions(max_side=1280, box_thresh=0.6, unclip_ratio=2.0),
        budget=ImageBudget(max_images=4, max_image_bytes=2 * 2**20, max_pixels=1000),
        max_boxes=9,
        use_classifier=False,
        rec_width_step=32,
        text_score=0.7,
    )


def test_the_dictionary_is_the_rec_directorys_unless_named_and_a_missing_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"rec/ppocr_keys_v1.txt' is not a file: give --ocr-dictionary FILE"):
        build_ocr(ocr_settings(tmp_path))
    (tmp_path / "rec").mkdir()
    (tmp_path / "rec" / "ppocr_keys_v1.txt").write_text("a\nb\n")
    served = build_ocr(ocr_settings(tmp_path))
    assert served.signature == SIGNATURE
    assert served.task.dictionary.characters == ("", "a", "b", " ")  # type: ignore[attr-defined]
    (tmp_path / "keys.txt").write_text("x\n")
    named = build_ocr(ocr_settings(tmp_path, "--ocr-dictionary", str(tmp_path / "keys.txt")))
    assert named.task.dictionary.characters == ("", "x", " ")  # type: ignore[attr-defined]
