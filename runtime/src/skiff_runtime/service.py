"""The model service: validates requests and hands them to the batching stage, which runs them on the workers.

The service takes domain requests only (tensors.InferRequest): every transport decodes at its edge (server/servicer
for OIP gRPC, server/rest, server/tfserving) and calls the same `admit`, `budget` and `infer`. Validation is the
model's contract (validation.py): the codecs check every request's heads against `contract` before decoding any
tensor data, and `infer` checks every request it runs against it again.

Workers own the engines (one engine per worker, created and run on that worker only), so no predictor is
ever shared between threads and no inference runs on the event loop. The batcher bounds the queue
(QueueFull past the limit) and never runs a request whose deadline has passed.

Admission comes before the request's bytes: `admit()` is asked when an RPC's headers arrive and counts the
request against max_queue_size while its message is still being received, so a server whose queue is full
refuses at once instead of after reading and decoding megabytes it will not run.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from skiff_runtime import validation
from skiff_runtime.batching.batcher import Batcher, BatchStats
from skiff_runtime.errors import DeadlineExceeded, InferenceFailed, ModelNotReady, QueueFull
from skiff_runtime.model_config import ModelConfig, model_config
from skiff_runtime.settings import DEFAULT_REQUEST_MEMORY_BYTES, BatchingLimits
from skiff_runtime.tensors import Array, InferRequest, InferResponse, ModelSignature, Tensor, datatype_of
from skiff_runtime.timing import RequestTimes
from skiff_runtime.workers.base import Workers

log = logging.getLogger(__name__)


class ModelState(enum.StrEnum):
    LOADING = "LOADING"
    READY = "READY"
    FAILED = "FAILED"
    STOPPING = "STOPPING"


DEFAULT_LIMITS = BatchingLimits()


class ByteBudget:
    """Bytes of request messages held at once (queued and running): memory bounded by bytes, not by count."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def check_room(self) -> None:
        """QueueFull when the budget is already spent: asked on the headers, before any byte is read."""
        if self.held >= self.limit:
            raise QueueFull(
                f"request memory budget full ({self.held} of {self.limit} bytes held by queued and running "
                "requests, --max-request-memory-mb); retry with backoff"
            )

    @contextmanager
    def hold(self, nbytes: int) -> Iterator[None]:
        """Count `nbytes` while the block runs; QueueFull if they do not fit."""
        if self.held + nbytes > self.limit:
            too_big = " (larger than the whole budget: raise --max-request-memory-mb)" if nbytes > self.limit else ""
            raise QueueFull(
                f"request memory budget full: {nbytes} more bytes do not fit ({self.held} of {self.limit} held)"
                f"{too_big}; retry with backoff"
            )
        self.held += nbytes
        try:
            yield
        finally:
            self.held -= nbytes


def select_outputs(
    outputs: Mapping[str, Array], signature: ModelSignature, requested: tuple[str, ...]
) -> tuple[Tensor, ...]:
    """Outputs in the signature's order, or in the requested order when outputs were requested."""
    names = requested or tuple(spec.name for spec in signature.outputs)
    return tuple(Tensor(name, datatype_of(outputs[name]), outputs[name]) for name in names)


class Admission:
    """A place in the queue held for one request whose message is still arriving; given up when the request
    enters the queue (or fails before it does). A context manager, released at most once."""

    def __init__(self, service: ModelService) -> None:
        self._service: ModelService | None = service

    def release(self) -> None:
        if self._service is not None:
            self._service._arriving -= 1
            self._service = None

    def __enter__(self) -> Admission:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class ModelService:
    """Serves one model version: readiness, validation, and the batcher in front of the workers."""

    def __init__(
        self,
        name: str,
        version: str,
        workers: Workers,
        limits: BatchingLimits = DEFAULT_LIMITS,
        on_batch: Callable[[BatchStats], None] | None = None,
        max_request_bytes: int = DEFAULT_REQUEST_MEMORY_BYTES,
    ) -> None:
        self.name = name
        self.version = version
        self.limits = limits
        self.workers = workers
        self._on_batch = on_batch
        self._batcher: Batcher | None = None
        self.state = ModelState.LOADING
        self.error: str | None = None
        self._arriving = 0  # admitted requests whose message has not reached the queue yet
        self._contract: validation.ModelContract | None = None
        self.budget = ByteBudget(max_request_bytes)

    @property
    def ready(self) -> bool:
        return self.state is ModelState.READY

    @property
    def signature(self) -> ModelSignature:
        if self.state in (ModelState.LOADING, ModelState.FAILED):
            raise ModelNotReady(f"model {self.name!r} is {self.state.value.lower()}")
        return self.workers.signature

    @property
    def contract(self) -> validation.ModelContract:
        """What requests must be for this model (its signature, max_batch_size): ModelNotReady until loaded."""
        signature = self.signature
        if self._contract is None or self._contract.signature is not signature:
            self._contract = validation.ModelContract(signature, self.limits.max_batch_size)
        return self._contract

    @property
    def platform(self) -> str:
        return "unknown" if self.state in (ModelState.LOADING, ModelState.FAILED) else self.workers.platform

    @property
    def batching(self) -> bool:
        """Whether requests share batches: asked for, and possible for this model's signature (`batched`, or
        `grouped` for a task, whose requests share sub-model calls)."""
        signature = self.workers.signature
        return self.limits.dynamic_batching and (signature.batched or signature.grouped)

    def model_config(self) -> ModelConfig:
        """Triton's model configuration of this model, for every transport; ModelNotReady until loaded."""
        return model_config(self.name, self.platform, self.signature, self.limits.max_batch_size)

    @property
    def queue_depth(self) -> int:
        return self._batcher.depth if self._batcher else 0

    def check_model(self, name: str, version: str) -> None:
        """NOT_FOUND unless (name, version) is this model; an empty version means the served one."""
        validation.check_model(name, version, self.name, self.version)

    def warmup_batch_sizes(self) -> list[int]:
        """Every batch size the batcher can emit when it merges; else the smallest and largest request."""
        if self.limits.dynamic_batching:
            return list(range(1, self.limits.max_batch_size + 1))
        return sorted({1, self.limits.max_batch_size})

    async def load(self) -> None:
        """Start the workers (each loads and warms its own engine), then the batcher."""
        started = time.monotonic()
        try:
            await self.workers.start(self.warmup_batch_sizes())
        except Exception as exc:
            self.state, self.error = ModelState.FAILED, str(exc)
            raise
        signature = self.workers.signature
        self._batcher = Batcher(
            self.workers.run,
            self.limits,
            self._on_batch,
            batched=signature.batched,
            concurrency=self.workers.count,
            run_group=self.workers.run_group if signature.grouped else None,  # a task: requests group, unmerged
            rows=functools.partial(validation.request_rows, signature) if signature.grouped else None,
        )
        self._batcher.start()
        if self.state is ModelState.LOADING:
            self.state = ModelState.READY
        log.info(
            "model ready",
            extra={
                "model": self.name,
                "version": self.version,
                "workers": self.workers.count,
                "batching": self.batching,
                "seconds": round(time.monotonic() - started, 3),
            },
        )

    def stop(self) -> None:
        """Refuse new requests (UNAVAILABLE); accepted ones still finish."""
        if self.state is not ModelState.FAILED:
            self.state = ModelState.STOPPING

    async def close(self) -> None:
        if self._batcher is not None:
            await self._batcher.close()
        await self.workers.close()

    @property
    def arriving(self) -> int:
        return self._arriving

    def admit(self) -> Admission:
        """Hold a queue place for a request whose message has not been read yet; QueueFull (or ModelNotReady) at
        once when the requests queued plus those still arriving already fill max_queue_size."""
        if self._batcher is None or self.state is not ModelState.READY:
            raise ModelNotReady(f"model {self.name!r} is {self.state.value.lower()}; retry when it is SERVING")
        self.budget.check_room()
        limit = self.limits.max_queue_size
        if self._arriving + self._batcher.depth >= limit:
            raise QueueFull(f"queue full ({limit} requests waiting or arriving, max_queue_size); retry with backoff")
        self._arriving += 1
        return Admission(self)

    async def infer(
        self,
        request: InferRequest,
        deadline: float | None = None,
        admission: Admission | None = None,
        times: RequestTimes | None = None,
    ) -> InferResponse:
        """Run one request. `deadline` is on the event loop's clock (loop.time()); `admission`, when the request
        was admitted before its message arrived, is handed over to the queue entry (or released on failure);
        `times` (a traced or timing-asking request) records its queue and batch moments (skiff_runtime.timing)."""
        try:
            return await self._infer(request, deadline, admission, times)
        finally:
            if admission is not None:
                admission.release()

    async def _infer(
        self, request: InferRequest, deadline: float | None, admission: Admission | None, times: RequestTimes | None
    ) -> InferResponse:
        self.check_model(request.model_name, request.model_version)
        if self._batcher is None or self.state is not ModelState.READY:
            raise ModelNotReady(f"model {self.name!r} is {self.state.value.lower()}; retry when it is SERVING")
        contract = self.contract
        contract.check_request(request)
        signature = contract.signature
        if deadline is not None and asyncio.get_running_loop().time() >= deadline:
            raise DeadlineExceeded("the request's deadline had passed on arrival; it was not run")
        if admission is not None:
            admission.release()  # its place passes to the queue entry that submit() appends without yielding
        outputs = await self._batcher.submit({t.name: t.data for t in request.inputs}, deadline, times)
        missing = [s.name for s in signature.outputs if s.name not in outputs]
        if missing:
            raise InferenceFailed(f"engine returned no output(s) {missing}")
        return InferResponse(
            model_name=self.name,
            model_version=self.version,
            id=request.id,
            outputs=select_outputs(outputs, signature, request.requested_outputs),
        )
