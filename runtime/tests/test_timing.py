"""timing: who gets a RequestTimes (traced or asking), what the timing parameters say, and the engine's moments."""

from __future__ import annotations

from skiff_runtime.tensors import InferResponse
from skiff_runtime.timing import (
    ENGINE_RUN,
    RequestTimes,
    answered,
    asks_for_timing,
    decoded_at,
    timing_parameters,
)


def test_only_a_request_that_asks_or_is_traced_gets_times() -> None:
    assert decoded_at(None, {}, 5) is None
    assert decoded_at(None, {"skiff_timing": False}, 5) is None
    asked = decoded_at(None, {"skiff_timing": True}, 5)
    assert asked is not None
    assert (asked.arrived, asked.report) == (5, True)
    assert asked.decoded > 0
    traced = RequestTimes(7, span=object())
    assert decoded_at(traced, {}, 7) is traced
    assert traced.report is False


def test_asking_takes_true_only() -> None:
    assert asks_for_timing({"skiff_timing": True})
    assert asks_for_timing({"skiff_timing": "TRUE"})
    assert not asks_for_timing({"skiff_timing": 1})
    assert not asks_for_timing({"skiff_timing": "yes"})
    assert not asks_for_timing({"other": True})


def test_the_parameters_are_queue_batch_engine_and_total_in_microseconds() -> None:
    times = RequestTimes(1_000_000, enqueued=2_000_000, batch_started=5_000_000)
    times.batch_rows = 8
    times.engine_started, times.engine_ended = 5_500_000, 9_500_000
    assert timing_parameters(times, 12_000_000) == {
        "queue_us": 3000,
        "batch_size": 8,
        "compute_us": 4000,
        "total_us": 11_000,
    }


def test_the_response_carries_them_only_when_asked() -> None:
    response = InferResponse("m", "1", "id", ())
    assert answered(response, None) is response
    traced = RequestTimes(1)
    assert answered(response, traced) is response
    assert traced.encoding > 0  # the encode span starts here
    asked = RequestTimes(1, report=True)
    assert set(answered(response, asked).parameters) == {"queue_us", "batch_size", "compute_us", "total_us"}


def test_a_batch_takes_the_engines_moments_from_the_worker_else_its_own() -> None:
    times = RequestTimes(1)
    token = ENGINE_RUN.set((30, 40))
    try:
        times.record_batch(20, 50, 4, 2, ("other",))
    finally:
        ENGINE_RUN.reset(token)
    assert (times.engine_started, times.engine_ended, times.batch_rows, times.merged) == (30, 40, 4, ("other",))
    times.record_batch(20, 50, 4, 2, ())
    assert (times.engine_started, times.engine_ended) == (20, 50)
