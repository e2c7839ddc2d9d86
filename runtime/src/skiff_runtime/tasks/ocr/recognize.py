"""Text recognition: crops -> 3 x 48 x W inputs grouped by width bucket; CTC decoding with the model's dictionary."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from skiff_runtime.errors import ModelLoadError
from skiff_runtime.tasks.ocr.classify import resized_and_padded
from skiff_runtime.tasks.ocr.detect import Floats
from skiff_runtime.tasks.ocr.images import Image

REC_HEIGHT = 48
MIN_WIDTH = 320  # PP-OCR's rec_image_shape width: narrower crops are padded to it
BLANK = 0  # CTC's blank is class 0; the dictionary follows, then a space


@dataclass(frozen=True)
class Dictionary:
    """The recognizer's classes: index -> character (blank first, space last, as PP-OCR trains them)."""

    characters: tuple[str, ...]

    @classmethod
    def read(cls, path: Path) -> Dictionary:
        """One character a line; only "\\n" ends a line (a dictionary may hold other Unicode line separators)."""
        try:
            lines = path.read_bytes().decode("utf-8").split("\n")
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelLoadError(f"cannot read the OCR dictionary {str(path)!r}: {exc}; give a UTF-8 file") from exc
        if lines and lines[-1] == "":
            lines.pop()
        return cls(("", *(line.strip("\r\n") for line in lines), " "))


def width_bucket(crop: Image, step: int) -> int:
    """The padded width a crop is recognised at: its width at 48 pixels high (at least MIN_WIDTH, as PaddleOCR pads
    a batch of one), rounded up to a multiple of step. Crops of one bucket share a shape, so they batch, within a
    request and across requests; step 1 pads each crop exactly as PaddleOCR does one crop alone."""
    natural = int(REC_HEIGHT * max(MIN_WIDTH / REC_HEIGHT, int(crop.shape[1]) / float(crop.shape[0])))
    return -(-natural // step) * step


def group_by_width(crops: Sequence[Image], step: int, batch: int) -> list[tuple[int, list[int]]]:
    """(width, crop indices) per recognizer call: crops grouped by width bucket, at most batch in one call."""
    buckets: dict[int, list[int]] = {}
    for index, crop in enumerate(crops):
        buckets.setdefault(width_bucket(crop, step), []).append(index)
    return [
        (width, indices[start : start + batch])
        for width, indices in sorted(buckets.items())
        for start in range(0, len(indices), batch)
    ]


def recognizer_input(crops: Sequence[Image], width: int) -> Floats:
    return np.stack([resized_and_padded(crop, REC_HEIGHT, width) for crop in crops]).astype(np.float32)


def ctc_decode(probabilities: Floats, dictionary: Dictionary) -> list[tuple[str, float]]:
    """N x T x classes -> (text, mean probability of the kept steps) per line: repeats merged, blanks dropped."""
    if probabilities.shape[-1] != len(dictionary.characters):
        raise ModelLoadError(
            f"the recognizer has {probabilities.shape[-1]} classes and the dictionary {len(dictionary.characters)} "
            "(its lines + blank + space): give the dictionary the model was trained with"
        )
    best = probabilities.argmax(axis=2)
    confidence = probabilities.max(axis=2)
    lines = []
    for indices, probs in zip(best, confidence, strict=True):
        keep = np.ones(len(indices), bool)
        keep[1:] = indices[1:] != indices[:-1]
        keep &= indices != BLANK
        text = "".join(dictionary.characters[i] for i in indices[keep])
        lines.append((text, float(probs[keep].astype(np.float64).mean()) if keep.any() else 0.0))
    return lines
