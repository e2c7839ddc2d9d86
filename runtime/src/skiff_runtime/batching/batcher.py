"""The dynamic batching stage: a bounded queue that merges compatible requests into batches.

Its limits are `settings.BatchingLimits`. With dynamic batching off, or for a model that is not `batched`
(tensors.ModelSignature.batched), every request runs alone. Otherwise a batch closes when it holds
`max_batch_size` rows, or `max_queue_delay_s` after its oldest request arrived, or at once when the delay is 0
(then it takes whatever is already waiting). Requests whose inputs differ in
dtype or non-batch shape go to different batches. A full queue refuses at once (QueueFull); a request whose
deadline passes while queued is answered DeadlineExceeded and never runs. Up to `concurrency` batches run at
the same time (one per inference worker). All timing is on `loop.time()`, so tests can drive a fake clock.

A grouped model (a task: `run_group` given) groups requests instead of merging them: any requests batch together
(their inputs need share no shape; a task's steps merge what they can, tasks.task.run_together), up to
`max_batch_size` rows, and each request is answered with its own outcome, its outputs or its own error. A group
is also capped by time and spread over the idle workers (`group_rows`): its rows times the seconds per row that
the last groups took (an average) stay within `max_group_s` (until a group has been timed, one row), and what is
queued is shared over the free slots, so 8 queued images on 2 idle workers run as two groups of 4 side by side,
and no group comes near the worker's batch timeout on a loaded CPU.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from skiff_runtime.batching.merge import BatchKey, batch_key, batch_size, split_outputs
from skiff_runtime.errors import DeadlineExceeded, InferenceFailed, QueueFull, SkiffError
from skiff_runtime.settings import BatchingLimits
from skiff_runtime.tensors import Array
from skiff_runtime.timing import ENGINE_RUN, RequestTimes, now_ns

# Runs the requests' inputs as one batch (the runner merges them with batching.merge: it knows where the batch
# must end up, e.g. straight into a worker's shared memory).
RunBatch = Callable[[Sequence[Mapping[str, Array]]], Awaitable[dict[str, Array]]]
# What one request of a group ends in: its outputs, or the error its own steps raised.
Outcome = dict[str, Array] | SkiffError
# Runs the requests side by side, unmerged: one outcome per request, in order.
RunGroup = Callable[[Sequence[Mapping[str, Array]]], Awaitable[list[Outcome]]]
GROUP_KEY: BatchKey = ()  # every request of a grouped model may share a batch
# The weight of the latest group in the running average of seconds per row (the rest is the earlier average).
ROW_SECONDS_WEIGHT = 0.3


def group_rows(max_rows: int, ready_rows: int, free_slots: int, row_seconds: float | None, max_group_s: float) -> int:
    """How many rows the next group of a grouped model may take: at most `max_rows`; its share of the
    `ready_rows` queued over the `free_slots` (the one about to run included); with a time cap (`max_group_s` > 0),
    as many rows as the average `row_seconds` fits in it, and one row until a group has been timed. Never below 1:
    the oldest request always runs."""
    rows = min(max_rows, -(-ready_rows // max(1, free_slots)))
    if max_group_s > 0 and row_seconds is None:
        rows = 1
    elif max_group_s > 0 and row_seconds:
        rows = min(rows, int(max_group_s / row_seconds))
    return max(1, rows)


def next_row_seconds(average: float | None, seconds: float, rows: int) -> float:
    """The running average of seconds per row after a group of `rows` ran for `seconds`."""
    observed = seconds / max(1, rows)
    return observed if average is None else (1 - ROW_SECONDS_WEIGHT) * average + ROW_SECONDS_WEIGHT * observed


@dataclass(frozen=True)
class BatchStats:
    """Reported for each batch that ran: rows, requests and how long the oldest one waited."""

    rows: int
    requests: int
    queue_seconds: float
    run_seconds: float


@dataclass(eq=False)
class _Pending:
    inputs: Mapping[str, Array]
    rows: int
    key: BatchKey
    deadline: float | None
    enqueued: float
    future: asyncio.Future[dict[str, Array]] = field(repr=False)
    times: RequestTimes | None = field(default=None, repr=False)  # a traced or timing-asking request's moments


class Batcher:
    """Owns the queue and the task that forms and dispatches batches."""

    def __init__(
        self,
        run_batch: RunBatch,
        limits: BatchingLimits,
        on_batch: Callable[[BatchStats], None] | None = None,
        *,
        batched: bool = True,
        concurrency: int = 1,
        run_group: RunGroup | None = None,
        rows: Callable[[Mapping[str, Array]], int] | None = None,
    ) -> None:
        self.limits = limits
        self._rows = rows or batch_size  # what a request counts against max_batch_size (a task's: its images)
        # Else every request runs alone.
        self.merges = limits.dynamic_batching and (batched or run_group is not None)
        self._run_batch = run_batch
        self._run_group = run_group
        self._on_batch = on_batch
        self._queue: collections.deque[_Pending] = collections.deque()
        self._wakeup = asyncio.Event()
        self._slots = asyncio.Semaphore(concurrency)
        self._concurrency = concurrency
        self.row_seconds: float | None = None  # a grouped model's average seconds per row (group_rows)
        self._task: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()

    @property
    def depth(self) -> int:
        """Requests waiting for a batch."""
        return len(self._queue)

    @property
    def running(self) -> int:
        return len(self._running)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="batcher")

    async def close(self) -> None:
        """Stop forming batches; running batches finish; requests still queued are refused."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
        while self._queue:
            pending = self._queue.popleft()
            if not pending.future.done():
                pending.future.set_exception(QueueFull("the server is shutting down; retry on another replica"))

    async def submit(
        self, inputs: Mapping[str, Array], deadline: float | None = None, times: RequestTimes | None = None
    ) -> dict[str, Array]:
        """Queue one validated request; returns its own slice of the batch outputs. `times`, when given, gets the
        moments it entered the queue and its batch ran, the batch's size and the other requests it merged."""
        if len(self._queue) >= self.limits.max_queue_size:
            raise QueueFull(
                f"queue full ({self.limits.max_queue_size} requests waiting, max_queue_size); retry with backoff"
            )
        loop = asyncio.get_running_loop()
        key = GROUP_KEY if self._run_group is not None else batch_key(inputs)
        pending = _Pending(inputs, self._rows(inputs), key, deadline, loop.time(), loop.create_future(), times)
        if times is not None:
            times.enqueued = now_ns()
        self._queue.append(pending)
        self._wakeup.set()
        return await pending.future

    def _expire(self, now: float) -> None:
        for pending in [p for p in self._queue if p.deadline is not None and p.deadline <= now]:
            self._queue.remove(pending)
            if not pending.future.done():
                pending.future.set_exception(
                    DeadlineExceeded(f"deadline passed after {now - pending.enqueued:.3f}s in the queue; not run")
                )

    def _batch_rows(self, key: BatchKey, *, shared: bool = True) -> int:
        """The most rows the next batch may take: max_batch_size, or for a grouped model `group_rows` (without
        `shared`: not divided over the free slots, the size at which waiting for more rows stops paying)."""
        if self._run_group is None:
            return self.limits.max_batch_size
        free = self._concurrency - len(self._running) if shared else 1  # the slot just taken is not running yet
        ready = self._ready_rows(key) if shared else self.limits.max_batch_size
        return group_rows(self.limits.max_batch_size, ready, free, self.row_seconds, self.limits.max_group_s)

    def _take_batch(self) -> list[_Pending]:
        """The oldest request plus the compatible ones behind it, up to `_batch_rows` rows."""
        first = self._queue[0]
        if not self.merges:
            return [self._queue.popleft()]
        batch: list[_Pending] = []
        rows = 0
        limit = self._batch_rows(first.key)
        for pending in list(self._queue):
            # The oldest request always goes: one counted past the limit would otherwise never run.
            if pending.key == first.key and (not batch or rows + pending.rows <= limit):
                batch.append(pending)
                rows += pending.rows
        for pending in batch:
            self._queue.remove(pending)
        return batch

    def _ready_rows(self, key: BatchKey) -> int:
        return sum(p.rows for p in self._queue if p.key == key)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            await self._slots.acquire()
            try:
                # Wait for the batch to fill, until the oldest request has waited max_queue_delay_s.
                while self._queue:
                    now = loop.time()
                    self._expire(now)
                    if not self._queue:
                        break
                    first = self._queue[0]
                    close_at = first.enqueued + self.limits.max_queue_delay_s
                    full = not self.merges or self._ready_rows(first.key) >= self._batch_rows(first.key, shared=False)
                    if full or now >= close_at:
                        break
                    self._wakeup.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wakeup.wait(), timeout=close_at - now)
                if not self._queue:
                    self._slots.release()
                    continue
                batch = self._take_batch()
            except BaseException:
                self._slots.release()
                raise
            task = loop.create_task(self._dispatch(batch, loop.time()))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _run_parts(self, live: list[_Pending], sizes: list[int]) -> Sequence[Outcome]:
        """Each request's outcome: its slice of the merged batch's outputs, or (grouped) its own."""
        if self._run_group is not None:
            outcomes = await self._run_group([p.inputs for p in live])
            if len(outcomes) != len(live):
                raise InferenceFailed(f"a group of {len(live)} request(s) came back with {len(outcomes)} outcomes")
            return outcomes
        return split_outputs(await self._run_batch([p.inputs for p in live]), sizes)

    async def _dispatch(self, batch: list[_Pending], started: float) -> None:
        loop = asyncio.get_running_loop()
        try:
            live = [p for p in batch if not p.future.done()]  # a cancelled caller has gone away
            if not live:
                return
            sizes = [p.rows for p in live]
            timed = [p.times for p in live if p.times is not None]
            began = now_ns() if timed else 0
            ENGINE_RUN.set(None)
            try:
                parts: Sequence[Outcome] = await self._run_parts(live, sizes)
            except SkiffError as exc:
                error: BaseException = exc
            except Exception as exc:
                error = InferenceFailed(f"batch of {len(live)} request(s) failed: {type(exc).__name__}: {exc}")
            else:
                if self._run_group is not None:
                    self.row_seconds = next_row_seconds(self.row_seconds, loop.time() - started, sum(sizes))
                if timed:
                    _record_batch(timed, began, sum(sizes), len(live))
                for pending, part in zip(live, parts, strict=True):
                    if pending.future.done():
                        continue
                    if isinstance(part, SkiffError):
                        pending.future.set_exception(part)
                    else:
                        pending.future.set_result(part)
                if self._on_batch is not None:
                    self._on_batch(
                        BatchStats(
                            sum(sizes), len(live), started - min(p.enqueued for p in live), loop.time() - started
                        )
                    )
                return
            if self._run_group is not None:  # a group that failed slow (its worker timed out) counts; a fast one not
                observed = next_row_seconds(self.row_seconds, loop.time() - started, sum(sizes))
                self.row_seconds = max(observed, self.row_seconds or 0.0)
            for pending in live:
                if not pending.future.done():
                    pending.future.set_exception(error)
        finally:
            self._slots.release()
            self._wakeup.set()


def _record_batch(timed: list[RequestTimes], began: int, rows: int, requests: int) -> None:
    """Each timed request's batch: when it ran, its size, and the trace spans of the others it merged."""
    ended = now_ns()
    for index, times in enumerate(timed):
        merged = tuple(t.context for other, t in enumerate(timed) if other != index and t.context is not None)
        times.record_batch(began, ended, rows, requests, merged)
