"""The bounded mirror: after this version answered a request, `offer` hands a sample of it to the candidate without
waiting and without raising. A copy that finds the queue full is dropped and counted, so a slow, stuck or failing
candidate costs the user's request nothing but the offer itself (a few microseconds: docs/design-decisions.md).
`run` sends the queued copies one at a time, each bounded by a timeout, compares the answers and counts them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from skiff_runtime.shadow.compare import Rules, compare_outputs
from skiff_runtime.tensors import Array

log = logging.getLogger(__name__)

# Sends one copy's inputs to the candidate (marked as shadow traffic) and returns its outputs.
Send = Callable[[Mapping[str, Array]], Awaitable[Mapping[str, Array]]]


@dataclass
class Tally:
    """What the mirror did, as counters (exported as skiff_shadow_requests_total{result=...})."""

    offered: int = 0  # requests answered while mirroring
    sampled: int = 0  # of those, picked by the ratio
    dropped: int = 0  # picked, but the queue was full: never sent
    agreed: int = 0
    disagreed: int = 0
    failed: int = 0  # the candidate errored or timed out: no answer to compare
    # Disagreeing copies by output (the stable version's output names: a bounded set), which outputs differed.
    outputs: dict[str, int] = field(default_factory=dict)

    @property
    def compared(self) -> int:
        return self.agreed + self.disagreed


@dataclass(frozen=True)
class Copy:
    inputs: Mapping[str, Array]
    outputs: Mapping[str, Array]  # what the user got


class Mirror:
    """Samples `ratio` of the offered requests (evenly: every 1/ratio-th, no randomness) into a queue of
    `queue_size`; `run` (one task) drains it."""

    def __init__(
        self,
        send: Send,
        rules: Rules,
        *,
        ratio: float,
        queue_size: int,
        timeout_s: float = 10.0,
        tally: Tally | None = None,
    ) -> None:
        """`tally`: counters to add to (kept across mirrors of one candidate, so the exported ones only grow)."""
        if not 0 < ratio <= 1 or queue_size < 1:
            raise ValueError(f"ratio must be in (0, 1] and queue_size at least 1 (got {ratio}, {queue_size})")
        self.send, self.rules, self.ratio, self.timeout_s = send, rules, ratio, timeout_s
        self.queue: asyncio.Queue[Copy] = asyncio.Queue(maxsize=queue_size)
        self.tally = Tally() if tally is None else tally
        self.last_difference = ""  # the latest disagreement, for the log and the status message
        self._credit = 0.0

    def offer(self, inputs: Mapping[str, Array], outputs: Mapping[str, Array]) -> bool:
        """Called on the user's path once its answer is ready: True when a copy was queued. Never waits, never
        raises; the arrays are kept by reference (the queue bounds how many)."""
        tally = self.tally
        tally.offered += 1
        self._credit += self.ratio
        if self._credit < 1:
            return False
        self._credit -= 1
        tally.sampled += 1
        try:
            self.queue.put_nowait(Copy(inputs, outputs))
        except asyncio.QueueFull:
            tally.dropped += 1
            return False
        return True

    async def run(self) -> None:
        """Sends, compares and counts queued copies until cancelled."""
        while True:
            copy = await self.queue.get()
            try:
                await self._judge(copy)
            finally:
                self.queue.task_done()

    async def _judge(self, copy: Copy) -> None:
        try:
            answer = await asyncio.wait_for(self.send(copy.inputs), self.timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the candidate's failure is counted, never the user's
            self.tally.failed += 1
            log.debug("shadow copy failed", extra={"error": str(exc)[:200]})
            return
        verdict = compare_outputs(copy.outputs, answer, self.rules)
        if verdict.agree:
            self.tally.agreed += 1
        else:
            self.tally.disagreed += 1
            for name in verdict.outputs:
                self.tally.outputs[name] = self.tally.outputs.get(name, 0) + 1
            self.last_difference = "; ".join(verdict.differing)[:500]
