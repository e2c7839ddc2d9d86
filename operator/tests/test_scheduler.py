"""scheduler on a fake event-loop clock (looptime): coalescing, one reconcile per model at a time, retries, the
worker bound, the spread resync and pausing. No real time passes; loop.time() jumps as the loop idles."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from skiff_operator.scheduler import Key, Scheduler, SchedulerOptions

pytestmark = pytest.mark.looptime
BERT = ("ml", "bert")
GPT = ("ml", "gpt")


class Recorder:
    """A reconciler that records (loop time, key), takes `duration_s`, and may ask for retries."""

    def __init__(self, duration_s: float = 0.0) -> None:
        self.duration_s = duration_s
        self.calls: list[tuple[float, Key]] = []
        self.retry: dict[Key, list[float | None]] = {}
        self.running: set[Key] = set()
        self.most_at_once = 0
        self.overlapped = False

    async def __call__(self, key: Key) -> float | None:
        if key in self.running:
            self.overlapped = True
        self.running.add(key)
        self.most_at_once = max(self.most_at_once, len(self.running))
        self.calls.append((asyncio.get_running_loop().time(), key))
        await asyncio.sleep(self.duration_s)
        self.running.discard(key)
        answers = self.retry.get(key)
        return answers.pop(0) if answers else None

    def times(self, key: Key) -> list[float]:
        return [round(at, 3) for at, k in self.calls if k == key]


@pytest.fixture
async def started() -> AsyncIterator[list[Scheduler]]:
    made: list[Scheduler] = []
    yield made
    for scheduler in made:
        await scheduler.stop()


def make(started: list[Scheduler], recorder: Recorder, **options: float) -> Scheduler:
    scheduler = Scheduler(recorder, SchedulerOptions(**options), logging.getLogger("test"))  # type: ignore[arg-type]
    scheduler.start()
    started.append(scheduler)
    return scheduler


async def test_a_storm_of_child_events_is_one_reconcile_after_the_debounce(started: list[Scheduler]) -> None:
    recorder = Recorder()
    scheduler = make(started, recorder, debounce_s=1.0, resync_interval_s=3600)
    start = asyncio.get_running_loop().time()
    for _ in range(50):
        scheduler.trigger(BERT)
        await asyncio.sleep(0.01)  # 50 events over 0.5 s, all within the first one's debounce
    await asyncio.sleep(5)
    assert recorder.times(BERT) == [round(start + 1.0, 3)]


async def test_an_immediate_trigger_moves_a_debounced_one_earlier(started: list[Scheduler]) -> None:
    recorder = Recorder()
    scheduler = make(started, recorder, debounce_s=1.0, resync_interval_s=3600)
    start = asyncio.get_running_loop().time()
    scheduler.trigger(BERT)  # a child event: in 1 s
    await asyncio.sleep(0.2)
    scheduler.trigger(BERT, 0)  # a spec change: now
    await asyncio.sleep(5)
    assert recorder.times(BERT) == [round(start + 0.2, 3)]


async def test_events_during_a_reconcile_queue_exactly_one_more_and_never_overlap(started: list[Scheduler]) -> None:
    recorder = Recorder(duration_s=2.0)
    scheduler = make(started, recorder, debounce_s=0.5, resync_interval_s=3600)
    start = asyncio.get_running_loop().time()
    scheduler.trigger(BERT, 0)
    await asyncio.sleep(0.5)  # running now (until start + 2)
    for _ in range(10):
        scheduler.trigger(BERT)  # e.g. its pods became ready after it read them
    await asyncio.sleep(10)
    assert recorder.times(BERT) == [round(start, 3), round(start + 2.5, 3)]  # once more, after the debounce
    assert not recorder.overlapped


async def test_retry_after_is_honoured(started: list[Scheduler]) -> None:
    recorder = Recorder()
    recorder.retry[BERT] = [4.0, 30.0, None]
    scheduler = make(started, recorder, debounce_s=1.0, resync_interval_s=3600)
    start = asyncio.get_running_loop().time()
    scheduler.trigger(BERT, 0)
    await asyncio.sleep(100)
    assert recorder.times(BERT) == [round(start, 3), round(start + 4, 3), round(start + 34, 3)]


async def test_a_failing_reconcile_is_logged_and_the_worker_goes_on(
    started: list[Scheduler], caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[Key] = []

    async def flaky(key: Key) -> float | None:
        calls.append(key)
        if key == BERT:
            raise RuntimeError("boom")
        return None

    scheduler = Scheduler(flaky, SchedulerOptions(workers=1, resync_interval_s=3600), logging.getLogger("test"))
    scheduler.start()
    started.append(scheduler)
    scheduler.trigger(BERT, 0)
    scheduler.trigger(GPT, 1)
    await asyncio.sleep(5)
    assert calls == [BERT, GPT]
    assert "reconcile of ml/bert failed" in caplog.text


async def test_at_most_workers_reconciles_run_at_once_and_all_finish(started: list[Scheduler]) -> None:
    recorder = Recorder(duration_s=1.0)
    scheduler = make(started, recorder, workers=4, resync_interval_s=3600)
    start = asyncio.get_running_loop().time()
    models = [("ml", f"m{i:03d}") for i in range(100)]
    for key in models:
        scheduler.trigger(key, 0)
    await asyncio.sleep(60)
    assert recorder.most_at_once == 4
    assert sorted(k for _, k in recorder.calls) == models  # each once
    assert max(at for at, _ in recorder.calls) == pytest.approx(start + 24, abs=0.01)  # 100 / 4 per second


async def test_resync_visits_every_model_once_per_period_spread_over_it(started: list[Scheduler]) -> None:
    recorder = Recorder()
    scheduler = make(started, recorder, resync_interval_s=100)
    start = asyncio.get_running_loop().time()
    models = [("ml", f"m{i}") for i in range(4)]
    scheduler.known.update(models)
    await asyncio.sleep(250)  # two rounds: 100-200 and 200-300 (the second one half seen)
    first_round = sorted(round(at - start) for at, _ in recorder.calls if at < start + 200)
    assert first_round == [100, 125, 150, 175]
    # At 200, m3 (reconciled at 175, within the last half period) is skipped: m0, m1, m2 over 200-300.
    assert sorted(round(at - start) for at, _ in recorder.calls if at >= start + 200) == [200, 233]


async def test_resync_skips_a_model_reconciled_in_the_last_half_period(started: list[Scheduler]) -> None:
    recorder = Recorder()
    scheduler = make(started, recorder, resync_interval_s=100)
    start = asyncio.get_running_loop().time()
    scheduler.known.add(GPT)
    await asyncio.sleep(89)
    scheduler.trigger(BERT, 0)  # at 89, e.g. its pod changed
    await asyncio.sleep(111 + 60)  # rounds at 100 (BERT skipped: 11 s ago) and 200 (both, spread: 200, 250)
    assert [round(t - start) for t in recorder.times(BERT)] == [89, 200]
    assert [round(t - start) for t in recorder.times(GPT)] == [100, 250]


async def test_a_forgotten_model_is_not_reconciled_or_resynced(started: list[Scheduler]) -> None:
    recorder = Recorder()
    scheduler = make(started, recorder, resync_interval_s=10)
    scheduler.trigger(BERT)  # queued for 1 s
    scheduler.forget(BERT)
    await asyncio.sleep(30)
    assert recorder.calls == []


async def test_paused_records_triggers_and_resume_runs_every_known_model(started: list[Scheduler]) -> None:
    recorder = Recorder()
    scheduler = make(started, recorder, resync_interval_s=3600)
    scheduler.pause()
    scheduler.trigger(BERT, 0)
    scheduler.known.add(GPT)  # seen before, nothing queued
    await asyncio.sleep(30)
    assert recorder.calls == []  # a standby writes nothing
    resumed = asyncio.get_running_loop().time()
    scheduler.resume(everything=True)
    await asyncio.sleep(1)
    assert sorted(k for _, k in recorder.calls) == [BERT, GPT]
    assert all(at == pytest.approx(resumed) for at, _ in recorder.calls)


def test_workers_must_be_positive() -> None:
    with pytest.raises(ValueError, match="workers must be at least 1"):
        Scheduler(Recorder(), SchedulerOptions(workers=0), logging.getLogger("test"))
