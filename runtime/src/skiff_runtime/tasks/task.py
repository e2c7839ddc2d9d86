"""The extension point for tasks: pre- and post-processing around several named sub-models, as pure steps.

A task turns a request's input tensors into output tensors by calling sub-models it names (`models`), for
example OCR's `det`, `cls` and `rec`. It never holds an engine: `steps(inputs)` is a generator that *yields* a
`ModelCall` (a sub-model's name and its input tensors, batch on axis 0) and is *sent* that call's outputs back,
until it returns the task's outputs. So the same task code runs

- in one call, with engines called directly: `run_task(task, inputs, engines)`, where `engines` maps each
  sub-model name to a callable `inputs -> outputs` (a worker's `Engine.run`, or a Paddle predictor in tests);
- for many requests at once: `run_together(task, requests, engines, max_batch)` drives their generators side by
  side and merges pending calls to one sub-model into one batch when the calls' inputs agree on every axis but
  the first (a task pads to buckets, as OCR's recognizer pads crops to width buckets, to make that likely), runs
  it once, and sends each generator its slice of the outputs. A worker given a batch of requests runs this.
  Sub-models named in `alone` never merge across requests (each request's call runs by itself): OCR's detector,
  whose batches cost as much per image as single images on CPU and whose new batch shapes cost oneDNN kernel builds.

A task refuses bad input with TaskInputError (an InvalidInput, so every transport answers INVALID_ARGUMENT)
before it yields its first call, so a refused request costs no model time; budgets (bytes, pixels, boxes) are
the task's own options.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

from skiff_runtime.errors import InferenceFailed, InvalidInput, ModelLoadError, SkiffError
from skiff_runtime.tensors import Array


class TaskInputError(InvalidInput, ValueError):
    """A task's input is malformed or over one of its budgets; the message says which and what to send instead."""


@dataclass(frozen=True)
class ModelCall:
    """One run of a sub-model: its name and its input tensors by input name, the batch on axis 0."""

    model: str
    inputs: Mapping[str, Array]


T = TypeVar("T")
# A run of steps that yields calls, is sent each call's outputs, and returns a T (use `yield from` to compose them).
Calls = Generator[ModelCall, Mapping[str, Array], T]
# What a task's steps() is: calls that return the task's outputs.
Steps = Calls[dict[str, Array]]
# A sub-model's engine as a task sees it: input tensors by name -> output tensors by name.
Engine = Callable[[Mapping[str, Array]], Mapping[str, Array]]


class Task(Protocol):
    """A pipeline over named sub-models. Implementations are immutable and safe to share between threads."""

    @property
    def name(self) -> str:
        """The task's name (`ocr`), as a version's spec names it."""
        ...

    @property
    def models(self) -> tuple[str, ...]:
        """The sub-models it calls, by the names its ModelCalls use."""
        ...

    def steps(self, inputs: Mapping[str, Array]) -> Steps:
        """The calls that turn inputs into outputs; TaskInputError before the first call for bad input."""
        ...


def check_engines(task: Task, engines: Mapping[str, Engine]) -> None:
    """ModelLoadError unless there is an engine for every sub-model the task names."""
    missing = [name for name in task.models if name not in engines]
    if missing:
        raise ModelLoadError(
            f"task {task.name!r} needs sub-models {list(task.models)}; no engine for {missing}: "
            "give the version a model directory for each"
        )


def run_task(task: Task, inputs: Mapping[str, Array], engines: Mapping[str, Engine]) -> dict[str, Array]:
    """Run a task's steps to the end, calling each sub-model's engine directly (one request, no batching)."""
    check_engines(task, engines)
    steps = task.steps(inputs)
    try:
        call = next(steps)
        while True:
            if call.model not in task.models:
                raise InferenceFailed(f"task {task.name!r} called sub-model {call.model!r} it does not name")
            call = steps.send(engines[call.model](call.inputs))
    except StopIteration as done:
        outputs: dict[str, Array] = done.value
        return outputs


Outcome = dict[str, Array] | SkiffError


def _call_key(call: ModelCall) -> tuple[object, ...]:
    """Calls with equal keys merge: same sub-model, same input names, dtypes and shapes past the batch axis."""
    return (call.model, *((name, a.dtype.str, a.shape[1:]) for name, a in sorted(call.inputs.items())))


@dataclass(frozen=True)
class MergedCall:
    """What run_together reports of each engine call it made: the sub-model, its rows and how many requests
    they came from (more than one: the call batched across requests)."""

    model: str
    rows: int
    requests: int


def run_together(
    task: Task,
    requests: Sequence[Mapping[str, Array]],
    engines: Mapping[str, Engine],
    max_batch: int = 64,
    on_call: Callable[[MergedCall], None] | None = None,
    alone: Collection[str] = (),
) -> list[Outcome]:
    """Run many requests' steps side by side, merging their calls that agree on shape into batches of at most
    max_batch rows (engines' outputs are batched on axis 0 too). Each request gets its outputs, or the SkiffError its
    own steps raised (a refused request never fails its neighbours); an engine's error fails the whole call.
    `on_call` hears of every engine call made; calls to a sub-model in `alone` run one request's call at a time."""
    check_engines(task, engines)
    outcomes: list[Outcome | None] = [None] * len(requests)
    pending: dict[int, tuple[Steps, ModelCall]] = {}

    def advance(index: int, steps: Steps, outputs: Mapping[str, Array] | None) -> None:
        try:
            call = next(steps) if outputs is None else steps.send(outputs)
        except StopIteration as done:
            outcomes[index] = done.value
            return
        except SkiffError as exc:
            outcomes[index] = exc
            return
        if call.model not in task.models:
            raise InferenceFailed(f"task {task.name!r} called sub-model {call.model!r} it does not name")
        pending[index] = (steps, call)

    for index, inputs in enumerate(requests):
        advance(index, task.steps(inputs), None)
    while pending:
        groups: dict[tuple[object, ...], list[int]] = {}
        for index, (_, call) in pending.items():
            key = (index, *_call_key(call)) if call.model in alone else _call_key(call)
            groups.setdefault(key, []).append(index)
        for members in groups.values():
            chunk: list[int] = []
            rows = 0
            for index in members:
                size = len(next(iter(pending[index][1].inputs.values())))
                if chunk and rows + size > max_batch:
                    _run_merged(chunk, pending, engines, advance, on_call)
                    chunk, rows = [], 0
                chunk.append(index)
                rows += size
            _run_merged(chunk, pending, engines, advance, on_call)
    finished = [outcome for outcome in outcomes if outcome is not None]
    assert len(finished) == len(requests)  # every request ends in outputs or its error
    return finished


def _run_merged(
    members: list[int],
    pending: dict[int, tuple[Steps, ModelCall]],
    engines: Mapping[str, Engine],
    advance: Callable[[int, Steps, Mapping[str, Array] | None], None],
    on_call: Callable[[MergedCall], None] | None,
) -> None:
    calls = [pending.pop(index) for index in members]
    first = calls[0][1]
    sizes = [len(next(iter(call.inputs.values()))) for _, call in calls]
    merged = {name: np.concatenate([call.inputs[name] for _, call in calls]) for name in first.inputs}
    outputs = engines[first.model](merged)
    if on_call is not None:
        on_call(MergedCall(first.model, sum(sizes), len(members)))
    start = 0
    for index, (steps, _), size in zip(members, calls, sizes, strict=True):
        advance(index, steps, {name: value[start : start + size] for name, value in outputs.items()})
        start += size
