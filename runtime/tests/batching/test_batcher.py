"""The batching stage on a fake event-loop clock (looptime): when batches close, what they hold, the queue
bound, deadlines and failures. No real time passes; loop.time() jumps as the loop idles."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from skiff_runtime.batching.batcher import Batcher, BatchStats, group_rows, next_row_seconds
from skiff_runtime.batching.merge import merge_inputs
from skiff_runtime.errors import DeadlineExceeded, InferenceFailed, InvalidInput, QueueFull, SkiffError
from skiff_runtime.settings import BatchingLimits
from skiff_runtime.tensors import Array

pytestmark = pytest.mark.looptime


class Engine:
    """A fake batch runner: records (start time, rows per part) and doubles x; may be held or made to fail."""

    def __init__(self, run_seconds: float = 0.0) -> None:
        self.batches: list[tuple[float, list[int]]] = []
        self.run_seconds = run_seconds
        self.hold: asyncio.Event | None = None
        self.fail: Exception | None = None
        self.in_flight = 0
        self.max_in_flight = 0

    async def run(self, parts: Sequence[Mapping[str, Array]]) -> dict[str, Array]:
        loop = asyncio.get_running_loop()
        self.batches.append((loop.time(), [int(p["x"].shape[0]) for p in parts]))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.hold is not None:
                await self.hold.wait()
            await asyncio.sleep(self.run_seconds)
            if self.fail is not None:
                raise self.fail
            return {"y": merge_inputs(parts)["x"] * 2}
        finally:
            self.in_flight -= 1


def rows(n: int, value: float = 1.0, width: int = 2, dtype: type = np.float32) -> dict[str, Array]:
    return {"x": np.full((n, width), value, dtype=dtype)}


async def start(
    engine: Engine, *, concurrency: int = 1, max_queue_delay_s: float = 0.0, **limits: object
) -> tuple[Batcher, list[BatchStats]]:
    stats: list[BatchStats] = []
    batching = BatchingLimits(max_queue_delay_us=round(max_queue_delay_s * 1e6), **limits)  # type: ignore[arg-type]
    batcher = Batcher(engine.run, batching, stats.append, concurrency=concurrency)
    batcher.start()
    return batcher, stats


async def after(delay: float, coro):  # type: ignore[no-untyped-def]
    await asyncio.sleep(delay)
    return await coro


async def test_a_lone_request_runs_at_once_when_the_delay_is_zero() -> None:
    engine = Engine()
    batcher, _ = await start(engine)
    out = await batcher.submit(rows(2, 3.0))
    assert out["y"].tolist() == [[6.0, 6.0], [6.0, 6.0]]
    assert engine.batches == [(0.0, [2])]
    await batcher.close()


async def test_requests_arriving_within_the_delay_share_a_batch_closed_at_the_delay() -> None:
    engine = Engine()
    batcher, stats = await start(engine, max_queue_delay_s=0.010)
    results = await asyncio.gather(
        batcher.submit(rows(1, 1.0)), after(0.003, batcher.submit(rows(2, 2.0))), after(0.020, batcher.submit(rows(1)))
    )
    assert engine.batches == [(pytest.approx(0.010), [1, 2]), (pytest.approx(0.030), [1])]
    assert results[0]["y"].tolist() == [[2.0, 2.0]]
    assert results[1]["y"].tolist() == [[4.0, 4.0], [4.0, 4.0]]
    assert [(s.rows, s.requests) for s in stats] == [(3, 2), (1, 1)]
    assert stats[0].queue_seconds == pytest.approx(0.010)
    await batcher.close()


async def test_a_full_batch_closes_before_the_delay() -> None:
    engine = Engine()
    batcher, _ = await start(engine, max_queue_delay_s=1.0, max_batch_size=4)
    await asyncio.gather(batcher.submit(rows(2)), after(0.001, batcher.submit(rows(2))))
    assert engine.batches == [(pytest.approx(0.001), [2, 2])]
    await batcher.close()


async def test_batches_never_exceed_max_batch_size_rows() -> None:
    engine = Engine()
    batcher, _ = await start(engine, max_queue_delay_s=0.005, max_batch_size=4)
    await asyncio.gather(*(batcher.submit(rows(n)) for n in (2, 1, 2, 3)))
    assert [parts for _, parts in engine.batches] == [[2, 1], [2], [3]]
    await batcher.close()


@pytest.mark.parametrize(
    "other",
    [rows(1, width=3), rows(1, dtype=np.float64)],
    ids=["different non-batch shape", "different dtype"],
)
async def test_incompatible_requests_go_to_separate_batches(other: dict[str, Array]) -> None:
    engine = Engine()
    batcher, _ = await start(engine, max_queue_delay_s=0.005)
    outs = await asyncio.gather(batcher.submit(rows(1)), batcher.submit(other), batcher.submit(rows(2)))
    assert [parts for _, parts in engine.batches] == [[1, 2], [1]]
    assert outs[1]["y"].shape == other["x"].shape
    await batcher.close()


async def test_without_merging_each_request_runs_alone() -> None:
    engine = Engine()
    batcher, _ = await start(engine, dynamic_batching=False, max_queue_delay_s=0.005)
    await asyncio.gather(*(batcher.submit(rows(1)) for _ in range(3)))
    assert [parts for _, parts in engine.batches] == [[1], [1], [1]]
    await batcher.close()


async def test_a_model_that_is_not_batched_runs_each_request_alone_with_batching_on() -> None:
    engine = Engine()
    batcher = Batcher(engine.run, BatchingLimits(max_queue_delay_us=5000), batched=False)
    assert not batcher.merges
    batcher.start()
    await asyncio.gather(*(batcher.submit(rows(1)) for _ in range(3)))
    assert [parts for _, parts in engine.batches] == [[1], [1], [1]]
    await batcher.close()


async def test_a_full_queue_refuses_at_once() -> None:
    engine = Engine()
    engine.hold = asyncio.Event()
    batcher, _ = await start(engine, max_queue_size=2)
    running = asyncio.ensure_future(batcher.submit(rows(1)))
    await asyncio.sleep(0.001)
    waiting = [asyncio.ensure_future(batcher.submit(rows(1))) for _ in range(2)]
    await asyncio.sleep(0.001)
    assert batcher.depth == 2
    loop = asyncio.get_running_loop()
    before = loop.time()
    with pytest.raises(QueueFull, match="queue full"):
        await batcher.submit(rows(1))
    assert loop.time() == before
    engine.hold.set()
    await asyncio.gather(running, *waiting)
    await batcher.close()


async def test_a_deadline_passing_in_the_queue_is_answered_and_never_run() -> None:
    engine = Engine(run_seconds=0.100)
    batcher, _ = await start(engine)
    loop = asyncio.get_running_loop()
    first = asyncio.ensure_future(batcher.submit(rows(1)))
    await asyncio.sleep(0.001)
    doomed = asyncio.ensure_future(batcher.submit(rows(3), deadline=loop.time() + 0.050))
    await first
    with pytest.raises(DeadlineExceeded, match="in the queue; not run"):
        await doomed
    assert [parts for _, parts in engine.batches] == [[1]]
    await batcher.submit(rows(3), deadline=loop.time() + 1)
    assert [parts for _, parts in engine.batches] == [[1], [3]]
    await batcher.close()


async def test_a_failing_batch_fails_its_requests_only() -> None:
    engine = Engine()
    batcher, _ = await start(engine, max_queue_delay_s=0.005)
    engine.fail = RuntimeError("CUDA error: an illegal memory access")
    results = await asyncio.gather(batcher.submit(rows(1)), batcher.submit(rows(1)), return_exceptions=True)
    assert all(isinstance(r, InferenceFailed) for r in results)
    assert "batch of 2 request(s) failed: RuntimeError: CUDA error" in str(results[0])
    engine.fail = None
    assert (await batcher.submit(rows(1)))["y"].shape == (1, 2)
    await batcher.close()


async def test_concurrency_bounds_the_batches_in_flight() -> None:
    engine = Engine(run_seconds=0.010)
    batcher, _ = await start(engine, concurrency=2, dynamic_batching=False)
    await asyncio.gather(*(batcher.submit(rows(1)) for _ in range(6)))
    assert engine.max_in_flight == 2
    assert [round(t, 3) for t, _ in engine.batches] == [0.0, 0.0, 0.01, 0.01, 0.02, 0.02]
    await batcher.close()


async def test_busy_workers_let_the_queue_build_into_bigger_batches() -> None:
    """With delay 0, batching is opportunistic: while the worker is busy, arrivals accumulate and merge."""
    engine = Engine(run_seconds=0.010)
    batcher, _ = await start(engine, max_batch_size=8)
    await asyncio.gather(*(after(i * 0.001, batcher.submit(rows(1))) for i in range(9)))
    assert [parts for _, parts in engine.batches] == [[1], [1] * 8]
    await batcher.close()


async def test_close_refuses_what_is_still_queued() -> None:
    engine = Engine()
    engine.hold = asyncio.Event()
    batcher, _ = await start(engine)
    running = asyncio.ensure_future(batcher.submit(rows(1)))
    await asyncio.sleep(0.001)
    queued = asyncio.ensure_future(batcher.submit(rows(1)))
    await asyncio.sleep(0.001)
    closing = asyncio.ensure_future(batcher.close())
    await asyncio.sleep(0.001)
    engine.hold.set()
    await closing
    assert (await running)["y"].shape == (1, 2)
    with pytest.raises(QueueFull, match="shutting down"):
        await queued


class GroupEngine:
    """A fake grouped runner (a task): each request's own outputs, with their own row count (one per element
    of x, whatever its shape), or its own error when its first value is negative."""

    def __init__(self, row_seconds: float = 0.0) -> None:
        self.groups: list[list[tuple[int, ...]]] = []
        self.row_seconds = row_seconds  # each request's rows cost this long (else a group takes 1 ms)
        self.started: list[float] = []
        self.fail: Exception | None = None

    async def run(self, parts: Sequence[Mapping[str, Array]]) -> dict[str, Array]:
        raise AssertionError("a grouped model's requests are never merged")

    async def run_group(self, requests: Sequence[Mapping[str, Array]]) -> list[dict[str, Array] | SkiffError]:
        self.groups.append([tuple(r["x"].shape) for r in requests])
        self.started.append(asyncio.get_running_loop().time())
        await asyncio.sleep(self.row_seconds * sum(int(r["x"].shape[0]) for r in requests) or 0.001)
        if self.fail is not None:
            raise self.fail
        return [
            InvalidInput("negative") if float(r["x"].flat[0]) < 0 else {"y": r["x"].reshape(-1) * 2} for r in requests
        ]


async def test_a_grouped_model_groups_requests_of_any_shape_and_answers_each_with_its_own_outcome() -> None:
    engine = GroupEngine()
    limits = BatchingLimits(max_queue_delay_us=5000, max_group_s=0)  # no cap by time: one group
    batcher = Batcher(engine.run, limits, batched=False, run_group=engine.run_group)
    batcher.start()
    results = await asyncio.gather(
        batcher.submit(rows(1, 1.0, width=2)),
        batcher.submit(rows(2, 3.0, width=5)),
        batcher.submit(rows(1, -1.0, width=3)),
        return_exceptions=True,
    )
    assert engine.groups == [[(1, 2), (2, 5), (1, 3)]]  # one group, no shape in common
    assert results[0]["y"].tolist() == [2.0, 2.0]  # type: ignore[index]
    assert results[1]["y"].tolist() == [6.0] * 10  # type: ignore[index]
    assert isinstance(results[2], InvalidInput)  # its own error; its neighbours ran
    await batcher.close()


async def test_a_grouped_model_without_dynamic_batching_runs_each_request_alone() -> None:
    engine = GroupEngine()
    limits = BatchingLimits(max_queue_delay_us=5000, dynamic_batching=False)
    batcher = Batcher(engine.run, limits, batched=False, run_group=engine.run_group)
    batcher.start()
    await asyncio.gather(batcher.submit(rows(1, width=2)), batcher.submit(rows(1, width=3)))
    assert engine.groups == [[(1, 2)], [(1, 3)]]
    await batcher.close()


async def test_a_group_is_bounded_by_max_batch_size_rows() -> None:
    engine = GroupEngine()
    batcher = Batcher(
        engine.run,
        BatchingLimits(max_queue_delay_us=5000, max_batch_size=3, max_group_s=0),
        batched=False,
        run_group=engine.run_group,
    )
    batcher.start()
    await asyncio.gather(*(batcher.submit(rows(2, width=w)) for w in (1, 2, 3)))
    assert engine.groups == [[(2, 1)], [(2, 2)], [(2, 3)]]  # 2 + 2 rows would pass 3
    await batcher.close()


async def test_a_group_counts_rows_as_the_model_says_and_always_takes_the_oldest_request() -> None:
    # An OCR request of one UINT8 H x W x C image is one row (validation.request_rows), not H of them.
    engine = GroupEngine()
    limits = BatchingLimits(max_queue_delay_us=5000, max_batch_size=3, max_group_s=0)
    one_image = Batcher(engine.run, limits, batched=False, run_group=engine.run_group, rows=lambda inputs: 1)
    one_image.start()
    await asyncio.gather(*(one_image.submit(rows(40, width=3)) for _ in range(3)))
    assert engine.groups == [[(40, 3)] * 3]  # three requests of one row each fill max_batch_size 3
    await one_image.close()
    engine.groups.clear()
    by_first_axis = Batcher(engine.run, limits, batched=False, run_group=engine.run_group)
    by_first_axis.start()
    results = await asyncio.wait_for(asyncio.gather(by_first_axis.submit(rows(40)), by_first_axis.submit(rows(1))), 5)
    assert engine.groups == [[(40, 2)], [(1, 2)]]  # counted 40 rows: alone, but run rather than left queued
    assert results[0]["y"].shape == (80,)
    await by_first_axis.close()


@pytest.mark.parametrize(
    ("max_rows", "ready", "free", "row_seconds", "max_group_s", "expected"),
    [
        (32, 8, 1, None, 0.0, 8),  # no time cap, one free worker: everything queued
        (32, 8, 2, None, 0.0, 4),  # two idle workers share it
        (32, 7, 2, None, 0.0, 4),  # rounded up: 4 + 3
        (32, 100, 1, None, 0.0, 32),  # never past max_batch_size
        (32, 8, 1, None, 15.0, 1),  # capped by time but not timed yet: one row
        (32, 8, 1, 2.0, 15.0, 7),  # 7 rows of 2 s fit in 15 s
        (32, 8, 1, 20.0, 15.0, 1),  # one row is longer than the cap: the oldest still runs
        (32, 8, 1, 0.0, 15.0, 8),  # rows that cost nothing measurable: the cap does not bind
        (32, 0, 3, None, 0.0, 1),
    ],
)
def test_group_rows(
    max_rows: int, ready: int, free: int, row_seconds: float | None, max_group_s: float, expected: int
) -> None:
    assert group_rows(max_rows, ready, free, row_seconds, max_group_s) == expected


def test_row_seconds_average_leans_on_history() -> None:
    assert next_row_seconds(None, 6.0, 3) == 2.0
    assert next_row_seconds(2.0, 12.0, 3) == pytest.approx(0.7 * 2.0 + 0.3 * 4.0)


async def test_queued_requests_of_a_grouped_model_are_shared_over_the_idle_workers() -> None:
    engine = GroupEngine(row_seconds=0.5)
    limits = BatchingLimits(max_group_s=0)
    batcher = Batcher(engine.run, limits, batched=False, concurrency=2, run_group=engine.run_group)
    await asyncio.gather(*(batcher.submit(rows(1, width=w)) for w in range(1, 9)), after(0.0, _start(batcher)))
    assert [len(group) for group in engine.groups] == [4, 4]  # side by side, not 8 on one worker and none on the other
    assert engine.started == [0.0, 0.0]
    await batcher.close()


async def _start(batcher: Batcher) -> None:
    batcher.start()


async def test_a_group_is_capped_by_the_time_its_rows_took_before() -> None:
    """1 s an image, a 2.5 s cap: the first group is one image (untimed), the later ones two (2 s fit, 3 s not)."""
    engine = GroupEngine(row_seconds=1.0)
    limits = BatchingLimits(max_group_s=2.5)
    batcher = Batcher(engine.run, limits, batched=False, run_group=engine.run_group)
    await asyncio.gather(*(batcher.submit(rows(1, width=w)) for w in range(1, 8)), after(0.0, _start(batcher)))
    assert [len(group) for group in engine.groups] == [1, 2, 2, 2]
    assert batcher.row_seconds == pytest.approx(1.0)
    unlimited = GroupEngine(row_seconds=1.0)
    no_cap = Batcher(unlimited.run, BatchingLimits(max_group_s=0), batched=False, run_group=unlimited.run_group)
    await asyncio.gather(*(no_cap.submit(rows(1, width=w)) for w in range(1, 8)), after(0.0, _start(no_cap)))
    assert [len(group) for group in unlimited.groups] == [7]  # the negative control: max_group_s 0
    await batcher.close()
    await no_cap.close()


async def test_a_group_that_failed_slowly_shrinks_the_next_one() -> None:
    """Thought 1 s an image, a group of 4 failed after 8 s (its worker timed out): the average rises to 1.3 s, so
    the next group under a 4.5 s cap is 3 images, not 4."""
    engine = GroupEngine(row_seconds=2.0)
    batcher = Batcher(engine.run, BatchingLimits(max_group_s=4.5), batched=False, run_group=engine.run_group)
    batcher.row_seconds = 1.0
    engine.fail = InferenceFailed("worker stopped after --batch-timeout-s")
    failed = await asyncio.gather(
        *(batcher.submit(rows(1, width=w)) for w in range(1, 5)), after(0.0, _start(batcher)), return_exceptions=True
    )
    assert all(isinstance(f, InferenceFailed) for f in failed[:4])
    assert batcher.row_seconds == pytest.approx(1.3)
    engine.fail, engine.row_seconds = None, 0.001
    await asyncio.gather(*(batcher.submit(rows(1, width=w)) for w in range(1, 5)))
    assert [len(group) for group in engine.groups] == [4, 3, 1]
    fast = GroupEngine(row_seconds=0.0)
    fast.fail = InferenceFailed("refused at once")
    quick = Batcher(fast.run, BatchingLimits(max_group_s=4.5), batched=False, run_group=fast.run_group)
    quick.row_seconds = 1.0
    await asyncio.gather(quick.submit(rows(1)), after(0.0, _start(quick)), return_exceptions=True)
    assert quick.row_seconds == 1.0  # a fast failure does not make the groups bigger
    await batcher.close()
    await quick.close()
