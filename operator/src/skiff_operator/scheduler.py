"""When each model is reconciled: triggers coalesce per model, a few workers run them, failures come back after
their delay and every model is resynced once per period; all timing on the event loop's clock (`loop.time()`).

Rules (tested on a fake clock in operator/tests/test_scheduler.py):
- A model is queued at most once. A trigger for a queued model moves it earlier if it asks for earlier, else
  adds nothing: a storm of child events while the model waits out the debounce is one reconcile.
- A model is reconciled by one worker at a time. A trigger while it runs (the reconcile may have read the
  children before that change) queues exactly one more reconcile after it, after the debounce.
- A reconcile that asks for a retry (`retry_after_s`) is queued again after that many seconds.
- At most `workers` reconciles run at once, earliest due first: a burst of 1,000 new models never puts 1,000
  reconciles (and their requests) on the API server at once, and models are served in the order they came.
- The resync queues every known model once per period, spread evenly over the period (not all at once),
  except models reconciled within the last half period for another reason: those are known to be current, and
  skipping them keeps a busy operator's resync from competing with the work that triggered them. Every model is
  thus reconciled at least once every 1.5 periods.
- While paused (a standby replica, see leader.py) triggers are recorded and nothing runs; `resume` runs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

Key = tuple[str, str]  # (namespace, InferenceModel name)
# Reconciles one model; returns seconds until it should be tried again (a failed apply), or None.
Reconciler = Callable[[Key], Awaitable[float | None]]
Logger = logging.Logger | logging.LoggerAdapter[Any]


@dataclass(frozen=True)
class SchedulerOptions:
    debounce_s: float = 1.0  # a child event waits this long, so the events that follow it join one reconcile
    resync_interval_s: float = 60.0  # every known model is reconciled once per this period
    workers: int = 32  # reconciles running at once, over all models


class Scheduler:
    """Queues and runs reconciles of models by key; see the module docstring for the rules."""

    def __init__(self, reconciler: Reconciler, options: SchedulerOptions, logger: Logger) -> None:
        if options.workers < 1:
            raise ValueError(f"workers must be at least 1, not {options.workers}")
        self.options = options
        self.known: set[Key] = set()  # the models the resync visits
        self._reconciler = reconciler
        self._logger = logger
        self._due: dict[Key, float] = {}  # queued models -> when they are due
        self._heap: list[tuple[float, Key]] = []  # (due, key), stale entries skipped when popped
        self._running: set[Key] = set()
        self._again: set[Key] = set()  # triggered while running: one more reconcile after this one
        self._finished: dict[Key, float] = {}  # when each model's last reconcile ended
        self._wake = asyncio.Event()
        self._active = asyncio.Event()
        self._active.set()
        self._tasks: list[asyncio.Task[None]] = []
        self.reconciles = 0  # finished reconciles, for tests and logs

    @property
    def running(self) -> int:
        """Reconciles running now."""
        return len(self._running)

    @property
    def queued(self) -> int:
        """Models queued for a reconcile, due or not yet."""
        return len(self._due)

    # -- triggers ---------------------------------------------------------------------------------------

    def trigger(self, key: Key, delay_s: float | None = None) -> None:
        """Reconcile `key` after `delay_s` (default: the debounce), coalescing with what is already queued."""
        self.known.add(key)
        self._queue(key, self.options.debounce_s if delay_s is None else delay_s)

    def forget(self, key: Key) -> None:
        """The model is gone: the resync stops visiting it and a queued reconcile is dropped."""
        self.known.discard(key)
        self._due.pop(key, None)
        self._again.discard(key)
        self._finished.pop(key, None)

    def _queue(self, key: Key, delay_s: float) -> None:
        if key in self._running:
            self._again.add(key)
            return
        due = _now() + max(0.0, delay_s)
        queued = self._due.get(key)
        if queued is not None and queued <= due:
            return
        self._due[key] = due
        heapq.heappush(self._heap, (due, key))
        self._wake.set()

    # -- leadership -------------------------------------------------------------------------------------

    @property
    def paused(self) -> bool:
        return not self._active.is_set()

    def pause(self) -> None:
        """Stop starting reconciles (those running finish); triggers are still recorded."""
        self._active.clear()

    def resume(self, *, everything: bool = False) -> None:
        """Start reconciles again; `everything`: queue every known model now (a new leader catches up)."""
        if everything:
            for key in sorted(self.known):
                self.trigger(key, 0)
        self._active.set()

    # -- running ----------------------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._work(), name=f"skiff-worker-{i}") for i in range(self.options.workers)]
        self._tasks.append(asyncio.create_task(self._resync(), name="skiff-resync"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    async def _next(self) -> Key:
        """Waits for the earliest due model that no other worker runs, and takes it off the queue."""
        while True:
            await self._active.wait()
            while self._heap and self._due.get(self._heap[0][1]) != self._heap[0][0]:
                heapq.heappop(self._heap)  # moved earlier, or forgotten
            if self._heap:
                due, key = self._heap[0]
                wait = due - _now()
                if wait <= 0:
                    heapq.heappop(self._heap)
                    del self._due[key]
                    return key
            else:
                wait = None
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    async def _work(self) -> None:
        while True:
            key = await self._next()
            self._running.add(key)
            retry_after_s: float | None = None
            try:
                retry_after_s = await self._reconciler(key)
            except asyncio.CancelledError:
                raise
            except Exception:  # one model's failure never stops the worker; the resync tries again
                self._logger.exception("reconcile of %s/%s failed", *key)
            finally:
                self._running.discard(key)
                self._finished[key] = _now()
                self.reconciles += 1
            if key in self._again:
                self._again.discard(key)
                self._queue(key, min(self.options.debounce_s, retry_after_s or self.options.debounce_s))
            elif retry_after_s is not None and key in self.known:
                self._queue(key, retry_after_s)

    async def _resync(self) -> None:
        """Every period, queues every known model not reconciled in the last half period, spread over the period."""
        period = self.options.resync_interval_s
        while True:
            await asyncio.sleep(period)
            recent = _now() - period / 2
            models = sorted(key for key in self.known if self._finished.get(key, recent) <= recent)
            for index, key in enumerate(models):
                self._queue(key, period * index / len(models))


def _now() -> float:
    return asyncio.get_running_loop().time()
