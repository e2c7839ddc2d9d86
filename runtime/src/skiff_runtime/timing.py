"""Where one request's time went: the moments a traced or timing-asking request passes each stage, and the timing
parameters a client asked for (`skiff_timing`).

A `RequestTimes` exists only for a request that is traced (sampled, skiff_runtime.tracing) or asked for its timing;
every other request carries None through the service and the batcher, which then take no clock readings for it.
Every moment is wall-clock nanoseconds (`time.time_ns()`, what trace spans carry): the engine's moments are read in
the worker process, on the same host's clock, and handed back to the front through ENGINE_RUN.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass

from skiff_runtime.tensors import InferResponse, ParameterValue

# The request parameter that asks for the timing parameters in the response (OIP gRPC and REST alike).
TIMING_PARAMETER = "skiff_timing"
# The REST response headers that carry the same numbers: parameter name -> header.
TIMING_HEADERS: Mapping[str, str] = {
    "queue_us": "Skiff-Queue-Us",
    "batch_size": "Skiff-Batch-Size",
    "compute_us": "Skiff-Compute-Us",
    "total_us": "Skiff-Total-Us",
}

# (start, end) of the engine run of the batch that the current task just ran, wall-clock ns: set by the workers
# (the worker process measures it; a thread worker around its executor call), read by the batcher after the run.
ENGINE_RUN: ContextVar[tuple[int, int] | None] = ContextVar("skiff_engine_run", default=None)


def now_ns() -> int:
    return time.time_ns()


@dataclass(eq=False, slots=True)
class RequestTimes:
    """One request's moments (wall-clock ns; 0 = not reached) and its batch; `span` is its trace span, if traced."""

    arrived: int
    decoded: int = 0
    enqueued: int = 0
    batch_started: int = 0
    batch_ended: int = 0
    engine_started: int = 0
    engine_ended: int = 0
    encoding: int = 0
    batch_rows: int = 0
    batch_requests: int = 0
    merged: tuple[object, ...] = ()  # the span contexts of the other traced requests that shared its batch
    span: object = None
    context: object = None  # the span's context, which the other requests of its batch link to
    report: bool = False  # the client asked for timing parameters

    def record_batch(self, started: int, ended: int, rows: int, requests: int, merged: tuple[object, ...]) -> None:
        self.batch_started, self.batch_ended, self.batch_rows, self.batch_requests = started, ended, rows, requests
        self.merged = merged
        engine = ENGINE_RUN.get()
        self.engine_started, self.engine_ended = engine if engine is not None else (started, ended)


def asks_for_timing(parameters: Mapping[str, ParameterValue]) -> bool:
    """Whether the request's parameters say `skiff_timing: true` (a bool, or the string "true" over REST forms)."""
    value = parameters.get(TIMING_PARAMETER)
    return value is True or (isinstance(value, str) and value.lower() == "true")


def timing_parameters(times: RequestTimes, now: int) -> dict[str, int]:
    """queue_us (arrival in the queue to its batch's start), batch_size (the batch's rows), compute_us (the engine
    run of that batch, measured by the worker), total_us (arrival of the request's headers to now: just before the
    response is serialized)."""
    return {
        "queue_us": max(0, times.batch_started - times.enqueued) // 1000,
        "batch_size": times.batch_rows,
        "compute_us": max(0, times.engine_ended - times.engine_started) // 1000,
        "total_us": max(0, now - times.arrived) // 1000,
    }


def decoded_at(
    times: RequestTimes | None, parameters: Mapping[str, ParameterValue], arrived: int
) -> RequestTimes | None:
    """After the request was decoded: its moments (marked decoded), a new RequestTimes when only its parameters ask
    for timing, None when it is neither traced nor asks."""
    asks = asks_for_timing(parameters)
    if times is None:
        return RequestTimes(arrived, decoded=now_ns(), report=True) if asks else None
    times.decoded, times.report = now_ns(), asks
    return times


def answered(response: InferResponse, times: RequestTimes | None) -> InferResponse:
    """Before the response is encoded: the moment marked, and the timing parameters added when its request asked
    for them; else the same response."""
    if times is None:
        return response
    times.encoding = now_ns()
    if not times.report:
        return response
    return dataclasses.replace(response, parameters={**response.parameters, **timing_parameters(times, times.encoding)})
