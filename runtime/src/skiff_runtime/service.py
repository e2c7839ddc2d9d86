"""The model service: loads and warms the engine in its own inference thread and runs requests there.

The engine is created, warmed and run on ONE dedicated thread, so no predictor is ever shared between
threads and no inference runs on the event loop. Waiting requests are bounded (QueueFull past the limit),
and a request whose deadline has passed when its turn comes is not run.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from skiff_runtime.codec import InferRequest, InferResponse, validate_request
from skiff_runtime.errors import (
    DeadlineExceeded,
    InferenceFailed,
    ModelNotFound,
    ModelNotReady,
    QueueFull,
    SkiffError,
)
from skiff_runtime.tensors import NUMPY_DTYPES, Array, ModelSignature, Tensor, datatype_of

log = logging.getLogger(__name__)

WARMUP_VARIABLE_DIM = 16


class Engine(Protocol):
    """What the service needs from an inference engine (predictor/paddle.py provides the real one)."""

    platform: str
    signature: ModelSignature

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]: ...


class ModelState(enum.StrEnum):
    LOADING = "LOADING"
    READY = "READY"
    FAILED = "FAILED"
    STOPPING = "STOPPING"


@dataclass(frozen=True)
class ServiceLimits:
    max_batch_size: int = 32
    max_queue_size: int = 256


def warmup_inputs(signature: ModelSignature, batch_size: int) -> dict[str, Array]:
    """Zero tensors for every input: batch dimension = batch_size, other variable dimensions = 16."""
    inputs: dict[str, Array] = {}
    for spec in signature.inputs:
        shape = [
            (batch_size if axis == 0 else WARMUP_VARIABLE_DIM) if dim == -1 else dim
            for axis, dim in enumerate(spec.shape)
        ]
        inputs[spec.name] = np.zeros(shape, dtype=NUMPY_DTYPES[spec.datatype])
    return inputs


def select_outputs(
    outputs: Mapping[str, Array], signature: ModelSignature, requested: tuple[str, ...]
) -> tuple[Tensor, ...]:
    """Outputs in the signature's order, or in the requested order when outputs were requested."""
    names = requested or tuple(spec.name for spec in signature.outputs)
    return tuple(Tensor(name, datatype_of(outputs[name]), outputs[name]) for name in names)


class ModelService:
    """Serves one model version through one engine on one inference thread."""

    def __init__(
        self,
        name: str,
        version: str,
        engine_factory: Callable[[], Engine],
        limits: ServiceLimits = ServiceLimits(),
    ) -> None:
        self.name = name
        self.version = version
        self.limits = limits
        self._engine_factory = engine_factory
        self._engine: Engine | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"infer-{name}")
        self._waiting = 0
        self.state = ModelState.LOADING
        self.error: str | None = None

    @property
    def ready(self) -> bool:
        return self.state is ModelState.READY

    @property
    def signature(self) -> ModelSignature:
        if self._engine is None:
            raise ModelNotReady(f"model {self.name!r} is {self.state.value.lower()}")
        return self._engine.signature

    @property
    def platform(self) -> str:
        return self._engine.platform if self._engine else "unknown"

    def check_model(self, name: str, version: str) -> None:
        """NOT_FOUND unless (name, version) is this model; an empty version means the served one."""
        if name != self.name:
            raise ModelNotFound(f"unknown model {name!r}; this server serves {self.name!r}")
        if version and version != self.version:
            raise ModelNotFound(f"model {name!r} has no version {version!r}; it serves version {self.version!r}")

    async def load(self) -> None:
        """Create the engine on the inference thread and warm it at batch 1 and the max batch size."""
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        try:
            self._engine = await loop.run_in_executor(self._executor, self._engine_factory)
            for batch in sorted({1, self.limits.max_batch_size}):
                inputs = warmup_inputs(self._engine.signature, batch)
                await loop.run_in_executor(self._executor, self._engine.run, inputs)
        except Exception as exc:
            self.state, self.error = ModelState.FAILED, str(exc)
            raise
        if self.state is ModelState.LOADING:
            self.state = ModelState.READY
        log.info(
            "model ready",
            extra={
                "model": self.name,
                "version": self.version,
                "seconds": round(time.monotonic() - started, 3),
            },
        )

    def stop(self) -> None:
        if self.state is not ModelState.FAILED:
            self.state = ModelState.STOPPING

    @property
    def in_flight(self) -> int:
        """Requests accepted and not yet answered by the engine."""
        return self._waiting

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    def _run_on_thread(self, engine: Engine, inputs: Mapping[str, Array], deadline: float | None) -> dict[str, Array]:
        if deadline is not None and time.monotonic() >= deadline:
            raise DeadlineExceeded("the request's deadline passed while it waited; it was not run")
        try:
            return engine.run(inputs)
        except SkiffError:
            raise
        except Exception as exc:
            raise InferenceFailed(f"inference engine failed: {type(exc).__name__}: {exc}") from exc

    async def infer(self, request: InferRequest, deadline: float | None = None) -> InferResponse:
        """Run one request. `deadline` is on time.monotonic() (the default event loop clock)."""
        self.check_model(request.model_name, request.model_version)
        engine = self._engine
        if engine is None or self.state is not ModelState.READY:
            raise ModelNotReady(f"model {self.name!r} is {self.state.value.lower()}; retry when it is SERVING")
        validate_request(request, engine.signature, self.limits.max_batch_size)
        if deadline is not None and time.monotonic() >= deadline:
            raise DeadlineExceeded("the request's deadline had passed on arrival; it was not run")
        if self._waiting >= self.limits.max_queue_size:
            raise QueueFull(f"{self._waiting} requests are waiting (max_queue_size); retry with backoff")
        inputs = {t.name: t.data for t in request.inputs}
        self._waiting += 1
        try:
            loop = asyncio.get_running_loop()
            outputs = await loop.run_in_executor(self._executor, self._run_on_thread, engine, inputs, deadline)
        finally:
            self._waiting -= 1
        missing = [s.name for s in engine.signature.outputs if s.name not in outputs]
        if missing:
            raise InferenceFailed(f"engine returned no output(s) {missing}")
        return InferResponse(
            model_name=self.name,
            model_version=self.version,
            id=request.id,
            outputs=select_outputs(outputs, engine.signature, request.requested_outputs),
        )
