"""Stand-ins shared by the runtime's tests: a fake engine, a picklable factory of one for worker processes
(`fake_engine`), a stand-in gRPC servicer context, and the request that fits the fake engine's signature.

Every test module takes its shared fakes from here; test modules never import one another.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Mapping

import grpc
import numpy as np

from skiff_runtime.errors import ModelLoadError
from skiff_runtime.settings import RuntimeSettings
from skiff_runtime.tensors import Array, Datatype, InferRequest, ModelSignature, Tensor, TensorSpec

SIGNATURE = ModelSignature(
    inputs=(TensorSpec("x", Datatype.FP32, (-1, 4)),),
    outputs=(
        TensorSpec("out", Datatype.FP32, (-1, 4)),
        TensorSpec("total", Datatype.FP64, (-1,)),
        TensorSpec("rows", Datatype.INT64, (-1,)),
    ),
)


def fake_outputs(inputs: Mapping[str, Array]) -> dict[str, Array]:
    """What the fake engine answers for `inputs`: x doubled, each row's sum, each row's index."""
    x = inputs["x"]
    return {
        "out": x * 2,
        "total": x.sum(axis=1, dtype=np.float64),
        "rows": np.arange(x.shape[0], dtype=np.int64),
    }


class FakeEngine:
    """Records every call; when `gate` is set to an Event, each run waits for it (on the inference thread)."""

    platform = "fake"

    def __init__(self, signature: ModelSignature = SIGNATURE) -> None:
        self.signature = signature
        self.calls: list[dict[str, Array]] = []
        self.threads: set[str] = set()
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.error: Exception | None = None
        self.drop_output: str | None = None

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        self.calls.append(dict(inputs))
        self.threads.add(threading.current_thread().name)
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(timeout=5), "test never released the engine"
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        outputs = fake_outputs(inputs)
        if self.drop_output:
            del outputs[self.drop_output]
        return outputs

    def block(self) -> threading.Event:
        self.gate = threading.Event()
        self.entered.clear()
        return self.gate

    def release(self) -> None:
        if self.gate is not None:
            self.gate.set()


def x_request(batch: int = 2, *, name: str = "m", version: str = "", outputs: tuple[str, ...] = ()) -> InferRequest:
    x = np.arange(batch * 4, dtype=np.float32).reshape(batch, 4)
    return InferRequest(name, version, "req-1", (Tensor("x", Datatype.FP32, x),), requested_outputs=outputs)


class FakeContext:
    """A gRPC servicer context: read() returns `message` after `delay_s` (never, when None); write() records;
    abort() records and raises like grpc's."""

    def __init__(self, message: object = grpc.aio.EOF, delay_s: float | None = 0.0) -> None:
        self.message = message
        self.delay_s = delay_s
        self.reads = 0
        self.written: list[object] = []
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    async def read(self) -> object:
        self.reads += 1
        if self.delay_s is None:
            await asyncio.Event().wait()
        await asyncio.sleep(self.delay_s or 0)
        return self.message

    async def write(self, item: object) -> None:
        self.written.append(item)

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise grpc.aio.AbortError()

    def time_remaining(self) -> None:
        return None


# A batch whose first value is one of these makes the worker-process fake misbehave (warm-up batches are zeros).
CRASH = -1.0  # the worker process exits at once (a native crash, an OOM kill)
CRASH_ONCE = -2.0  # the first worker to see it exits; the batch then runs on another one
HANG = -3.0  # the engine never answers
FAIL = -4.0  # the engine raises
SLOW = -5.0  # the engine takes SLOW_S
SLOW_S = 0.5
CANNOT_LOAD = "cannot-load"  # the model name the worker-process fake refuses to load


class WorkerFakeEngine:
    """The fake engine a worker process builds (`fake_engine`): FakeEngine's outputs, plus each row's worker pid and
    when the run started and ended (time.monotonic, shared by every process), and the behaviours above."""

    platform = "fake"
    signature = SIGNATURE

    def __init__(self, settings: RuntimeSettings) -> None:
        self.crash_marker = settings.model_dir / "crash-once"

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        started = time.monotonic()
        first = float(inputs["x"].flat[0]) if inputs["x"].size else 0.0
        if first == CRASH:
            os._exit(3)
        if first == CRASH_ONCE:
            with contextlib.suppress(FileNotFoundError):
                self.crash_marker.unlink()  # only one worker claims the marker
                os._exit(3)
        if first == HANG:
            time.sleep(3600)
        if first == FAIL:
            raise ValueError("the fake engine refuses this batch")
        if first == SLOW:
            time.sleep(SLOW_S)
        rows = inputs["x"].shape[0]
        return {
            **fake_outputs(inputs),
            "pid": np.full(rows, os.getpid(), dtype=np.int64),
            "span": np.tile(np.array([started, time.monotonic()]), (rows, 1)),
        }


def fake_engine(settings: RuntimeSettings) -> WorkerFakeEngine:
    """A picklable EngineFactory for workers.process.ProcessPool: no Paddle, starts in the time of an import."""
    if settings.model_name == CANNOT_LOAD:
        raise ModelLoadError("the fake model cannot load: serve another")
    return WorkerFakeEngine(settings)
