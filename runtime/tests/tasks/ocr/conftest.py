"""Fixtures for the ocr task's tests: the real PP-OCRv4 weights on Skiff's Paddle engine, and RapidOCR as reference."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from bench.ocr.samples import Sample, missing_fonts, samples

from skiff_runtime.tasks.ocr.recognize import Dictionary
from skiff_runtime.tasks.ocr.weights import OcrWeights, find_ppocr_v4_weights
from skiff_runtime.tasks.task import Engine


@pytest.fixture(scope="session")
def ocr_weights() -> OcrWeights:
    return find_ppocr_v4_weights()


@pytest.fixture(scope="session")
def dictionary(ocr_weights: OcrWeights) -> Dictionary:
    return Dictionary.read(ocr_weights.dictionary)


@pytest.fixture(scope="session")
def ocr_engines(ocr_weights: OcrWeights) -> dict[str, Engine]:
    """det, cls and rec on the engine a worker builds (predictor/paddle.py, default settings: oneDNN, 1 thread)."""
    from skiff_runtime.predictor.paddle import PaddleEngine
    from skiff_runtime.settings import parse_settings

    return {
        name: PaddleEngine(parse_settings(["--model-dir", str(folder), "--model-name", name], env={})).run
        for name, folder in ocr_weights.model_dirs.items()
    }


@pytest.fixture(scope="session")
def reference() -> Any:
    """RapidOCR 1.4.5's own pipeline on the same weights, with PaddleOCR's detector limit (max side 960) and one
    crop per recognizer call (so no crop is padded to a neighbour's width: PaddleOCR's batch-of-one output)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from rapidocr_paddle import RapidOCR

    return RapidOCR(det_limit_type="max", det_limit_side_len=960, rec_batch_num=1)


@pytest.fixture(scope="session")
def rendered() -> dict[str, Sample]:
    missing = missing_fonts()
    if missing:
        pytest.fail(f"fonts missing: apt-get install {' '.join(missing)} (.ci/run's apt line installs them)")
    return {sample.name: sample for sample in samples()}
