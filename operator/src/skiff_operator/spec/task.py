"""spec.versions[].task: a version that serves a task (ocr: detection, direction, recognition) as one model, its
sub-model directories, dictionary and knobs, checked as the CRD's schema and CEL rules check them."""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skiff_operator.conditions import Reason
from skiff_operator.errors import SpecError


class TaskName(enum.StrEnum):
    """The tasks a version may serve instead of one model (the runtime's --task, skiff_runtime.settings.TASKS)."""

    OCR = "ocr"


# Each task's sub-models, in the order they run (the runtime's settings.OCR_MODELS for ocr).
TASK_SUB_MODELS: dict[TaskName, tuple[str, ...]] = {TaskName.OCR: ("det", "cls", "rec")}
# packaged://<name>: weights the runtime image holds (runtime/Dockerfile copies them) -> the task they serve.
PACKAGED_WEIGHTS: dict[str, TaskName] = {"pp-ocrv4": TaskName.OCR}
# A sub-model directory or the dictionary, inside the version's model directory: relative, no '.' or '..' segments.
TASK_PATH = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*")
MAX_TASK_PATH = 256


@dataclass(frozen=True)
class Bound:
    """One row of versions[].task.options: its CRD key, its type and its bounds (the CRD's minimum/maximum)."""

    key: str
    kind: type
    minimum: float | None = None
    maximum: float | None = None


@dataclass(frozen=True)
class OcrOptions:
    """versions[].task.options of an ocr task: PaddleOCR's knobs and the request budgets. None: the runtime's
    default (docs/ocr.md), and nothing is rendered for it."""

    box_thresh: float | None = None
    unclip_ratio: float | None = None
    det_max_side: int | None = None
    text_score: float | None = None
    use_classifier: bool | None = None
    rec_width_step: int | None = None
    max_images: int | None = None
    max_image_mb: int | None = None
    max_pixels: int | None = None
    max_boxes: int | None = None


# OcrOptions field -> its CRD key and bounds, written once (operator/tests/test_crd.py ties the CRD to it; the
# runtime's own parsers accept every value inside them: tests/test_pod_env_contract.py).
OCR_OPTIONS: dict[str, Bound] = {
    "box_thresh": Bound("boxThresh", float, 0, 1),
    "unclip_ratio": Bound("unclipRatio", float, 0.1, 10),
    "det_max_side": Bound("detMaxSide", int, 32, 4096),
    "text_score": Bound("textScore", float, 0, 1),
    "use_classifier": Bound("useClassifier", bool),
    "rec_width_step": Bound("recWidthStep", int, 1, 1024),
    "max_images": Bound("maxImages", int, 1, 256),
    "max_image_mb": Bound("maxImageMb", int, 1, 1024),
    "max_pixels": Bound("maxPixels", int, 1, 200_000_000),
    "max_boxes": Bound("maxBoxes", int, 1, 10_000),
}


@dataclass(frozen=True)
class TaskSpec:
    """versions[].task: serve a task (its sub-models and the steps between them) as one model."""

    name: TaskName
    models: tuple[tuple[str, str], ...] = ()  # sub-model -> its directory in the model directory; (): det/, cls/, rec/
    dictionary: str | None = None  # inside the model directory; None: the runtime's rec/ppocr_keys_v1.txt
    options: OcrOptions = OcrOptions()

    @property
    def sub_models(self) -> tuple[str, ...]:
        return TASK_SUB_MODELS[self.name]

    def sub_model_dir(self, sub_model: str) -> str:
        """Where `sub_model` lives, relative to the version's model directory."""
        return dict(self.models).get(sub_model, sub_model)


def parse_task(raw: Any, version: str) -> TaskSpec | None:
    """versions[].task, or None when the version serves one model."""
    if raw is None:
        return None
    where = f"spec.versions[{version}].task"
    task = _mapping(raw, where)
    try:
        name = TaskName(str(task.get("name")))
    except ValueError:
        known = ", ".join(t.value for t in TaskName)
        raise SpecError(Reason.INVALID_SPEC, f"{where}.name must be one of {known}") from None
    unknown = sorted(set(task) - {"name", "models", "dictionary", "options"})
    if unknown:
        raise SpecError(Reason.INVALID_SPEC, f"{where} has no field {', '.join(unknown)}")
    models: tuple[tuple[str, str], ...] = ()
    if task.get("models") is not None:
        given = _mapping(task["models"], f"{where}.models")
        wanted = TASK_SUB_MODELS[name]
        if sorted(given) != sorted(wanted):
            raise SpecError(
                Reason.INVALID_SPEC,
                f"{where}.models must name a directory for each of {', '.join(wanted)} (got "
                f"{', '.join(sorted(map(str, given))) or 'none'}), or be left out for the layout {'/, '.join(wanted)}/",
            )
        models = tuple((sub, _path(given[sub], f"{where}.models.{sub}")) for sub in wanted)
    dictionary = task.get("dictionary")
    return TaskSpec(
        name=name,
        models=models,
        dictionary=None if dictionary is None else _path(dictionary, f"{where}.dictionary"),
        options=_parse_options(_mapping(task.get("options", {}), f"{where}.options"), f"{where}.options"),
    )


def _parse_options(raw: Mapping[str, Any], where: str) -> OcrOptions:
    by_key = {bound.key: name for name, bound in OCR_OPTIONS.items()}
    unknown = sorted(set(raw) - set(by_key))
    if unknown:
        raise SpecError(
            Reason.INVALID_SPEC, f"{where} has no option {', '.join(unknown)}; the options are {', '.join(by_key)}"
        )
    values: dict[str, Any] = {
        by_key[key]: _option(value, OCR_OPTIONS[by_key[key]], f"{where}.{key}") for key, value in raw.items()
    }
    return OcrOptions(**values)


def _option(value: Any, bound: Bound, where: str) -> float | int | bool:
    if bound.kind is bool:
        if not isinstance(value, bool):
            raise SpecError(Reason.INVALID_SPEC, f"{where} must be true or false")
        return value
    number_types = (int,) if bound.kind is int else (int, float)
    if isinstance(value, bool) or not isinstance(value, number_types) or not math.isfinite(value):
        raise SpecError(Reason.INVALID_SPEC, f"{where} must be {'an integer' if bound.kind is int else 'a number'}")
    assert bound.minimum is not None
    assert bound.maximum is not None
    if not bound.minimum <= value <= bound.maximum:
        raise SpecError(Reason.INVALID_SPEC, f"{where} must be from {bound.minimum:g} to {bound.maximum:g}")
    return bound.kind(value)  # type: ignore[no-any-return]


def _path(value: Any, where: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_TASK_PATH or TASK_PATH.fullmatch(value) is None:
        raise SpecError(
            Reason.INVALID_SPEC,
            f"{where} must be a relative path inside the version's model directory (segments of letters, digits, "
            f"'_', '-', '.', not starting with '.'; at most {MAX_TASK_PATH} characters), e.g. det or rec/keys.txt",
        )
    return value


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SpecError(Reason.INVALID_SPEC, f"{where} must be an object")
    return value
