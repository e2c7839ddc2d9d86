"""A task served as one engine on a worker: one Paddle engine per sub-model, the task's steps run beside them.

`load_task_engine(settings)` is the worker's engine factory when `--task` is set: it builds each sub-model's
engine with predictor.loader (so Paddle stays on the worker), the task from the settings (TASK_BUILDERS), and
warms them with one sample request. A batch of requests from the batcher runs through `run_together`, which
merges the sub-model calls of different requests that agree on shape (the recognizer's crops of one width bucket
from every request in the group, the classifier's crops), never the detector's (ServedTask.alone), and answers
each request with its own outputs or its own error.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import cv2
import numpy as np

from skiff_runtime.errors import ModelLoadError, SkiffError
from skiff_runtime.predictor.engine import Engine
from skiff_runtime.predictor.loader import load_engine
from skiff_runtime.settings import RuntimeSettings
from skiff_runtime.tasks.ocr.detect import DetectOptions
from skiff_runtime.tasks.ocr.images import ImageBudget
from skiff_runtime.tasks.ocr.pipeline import INPUT, SIGNATURE, OcrOptions, OcrTask
from skiff_runtime.tasks.ocr.recognize import Dictionary
from skiff_runtime.tasks.task import MergedCall, Task, check_engines, run_task, run_together
from skiff_runtime.tensors import Array, ModelSignature

log = logging.getLogger(__name__)

PLATFORM_PREFIX = "skiff_task_"
DEFAULT_DICTIONARY = "ppocr_keys_v1.txt"  # looked for in the rec directory when --ocr-dictionary is not given


@dataclass(frozen=True)
class ServedTask:
    """A task with what it serves (its signature), one request that warms every sub-model it calls, and the
    sub-models whose calls never merge across requests (run_together's `alone`)."""

    task: Task
    signature: ModelSignature
    warmup: Mapping[str, Array]
    alone: tuple[str, ...] = ()


def ocr_options(settings: RuntimeSettings) -> OcrOptions:
    """The ocr task's options from the settings rows (settings.OcrSettings)."""
    ocr = settings.ocr
    return OcrOptions(
        detect=DetectOptions(
            max_side=ocr.ocr_det_max_side, box_thresh=ocr.ocr_box_thresh, unclip_ratio=ocr.ocr_unclip_ratio
        ),
        budget=ImageBudget(
            max_images=ocr.ocr_max_images, max_image_bytes=ocr.ocr_max_image_mb * 2**20, max_pixels=ocr.ocr_max_pixels
        ),
        max_boxes=ocr.ocr_max_boxes,
        use_classifier=ocr.ocr_use_classifier,
        rec_width_step=ocr.ocr_rec_width_step,
        text_score=ocr.ocr_text_score,
    )


def ocr_warmup_image() -> bytes:
    """A PNG with one line of text on white: the detector finds it, so cls and rec run (and warm) too."""
    image = np.full((64, 320, 3), 255, np.uint8)
    cv2.putText(image, "Skiff 2026", (16, 44), cv2.FONT_HERSHEY_SIMPLEX, 1.0, (0, 0, 0), 2)
    ok, encoded = cv2.imencode(".png", image)
    assert ok
    return encoded.tobytes()


def build_ocr(settings: RuntimeSettings) -> ServedTask:
    dictionary_path = settings.ocr.ocr_dictionary or settings.sub_model_dirs()["rec"] / DEFAULT_DICTIONARY
    if not dictionary_path.is_file():
        raise ModelLoadError(
            f"the ocr task's dictionary {str(dictionary_path)!r} is not a file: give --ocr-dictionary FILE "
            "(one character a line, the recognizer's, e.g. ppocr_keys_v1.txt)"
        )
    task = OcrTask(Dictionary.read(dictionary_path), ocr_options(settings))
    warmup = {INPUT: np.array([ocr_warmup_image()], dtype=object)}
    # The detector runs each request's images by itself: on CPU a batch of 4 costs 1.10x a single image's time per
    # image, and every new batch shape costs oneDNN a kernel build (bench/ocr/RESULTS.md); cls and rec merge.
    return ServedTask(task, SIGNATURE, warmup, alone=("det",))


# Task name (--task) -> how its task is built from the settings.
TASK_BUILDERS: Mapping[str, Callable[[RuntimeSettings], ServedTask]] = {"ocr": build_ocr}


@dataclass
class TaskEngine:
    """A GroupEngine (predictor.engine): the task over its sub-models' engines, used by one thread at a time."""

    served: ServedTask
    engines: Mapping[str, Engine]
    max_batch: int
    platform: str = field(init=False)
    signature: ModelSignature = field(init=False)
    calls: list[MergedCall] = field(default_factory=list)  # the last group's engine calls, for its log line

    def __post_init__(self) -> None:
        self.platform = PLATFORM_PREFIX + self.served.task.name
        self.signature = self.served.signature
        self._runs = {name: engine.run for name, engine in self.engines.items()}
        check_engines(self.served.task, self._runs)

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        return run_task(self.served.task, inputs, self._runs)

    def run_group(self, requests: Sequence[Mapping[str, Array]]) -> list[dict[str, Array] | SkiffError]:
        self.calls = []
        outcomes = run_together(
            self.served.task, requests, self._runs, self.max_batch, self.calls.append, self.served.alone
        )
        log.debug(
            "task group ran",
            extra={
                "task": self.served.task.name,
                "requests": len(requests),
                "calls": [[c.model, c.rows, c.requests] for c in self.calls],
            },
        )
        return outcomes


def load_task_engine(settings: RuntimeSettings) -> TaskEngine:
    """The worker's engine for --task: each sub-model's engine from its directory, the task, one warm-up run."""
    if settings.task is None or settings.task not in TASK_BUILDERS:
        raise ModelLoadError(f"no task named {settings.task!r}; tasks: {', '.join(TASK_BUILDERS)}")
    served = TASK_BUILDERS[settings.task](settings)
    directories = settings.sub_model_dirs()
    missing = [name for name in served.task.models if name not in directories]
    if missing:
        raise ModelLoadError(f"task {settings.task!r} needs a directory for {missing}: add them to --task-models")
    engines = {
        name: load_engine(dataclasses.replace(settings, model_dir=directories[name], task=None))
        for name in served.task.models
    }
    engine = TaskEngine(served, engines, settings.batching.max_batch_size)
    outcome = engine.run_group([served.warmup])[0]
    if isinstance(outcome, SkiffError):
        raise ModelLoadError(f"task {settings.task!r} failed its warm-up request: {outcome}")
    return engine
