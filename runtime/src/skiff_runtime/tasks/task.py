"""The extension point for tasks: pre- and post-processing around several named sub-models, as pure steps.

A task turns a request's input tensors into output tensors by calling sub-models it names (`models`), for
example OCR's `det`, `cls` and `rec`. It never holds an engine: `steps(inputs)` is a generator that *yields* a
`ModelCall` (a sub-model's name and its input tensors, batch on axis 0) and is *sent* that call's outputs back,
until it returns the task's outputs. So the same task code runs

- in one call, with engines called directly: `run_task(task, inputs, engines)`, where `engines` maps each
  sub-model name to a callable `inputs -> outputs` (a worker's `Engine.run`, or a Paddle predictor in tests);
- in a worker that serves many requests at once: it drives the generators of concurrent requests side by side and
  merges their pending calls to one sub-model into one batch when the calls' inputs agree on every axis but the
  first (a task pads to buckets, as OCR's recognizer pads crops to width buckets, to make that likely), runs it
  once, and sends each generator its slice of the outputs.

A task refuses bad input with TaskInputError (an InvalidInput, so every transport answers INVALID_ARGUMENT)
before it yields its first call, so a refused request costs no model time; budgets (bytes, pixels, boxes) are
the task's own options.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from skiff_runtime.errors import InferenceFailed, InvalidInput, ModelLoadError
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

    name: str
    models: tuple[str, ...]

    def steps(self, inputs: Mapping[str, Array]) -> Steps: ...


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
