"""Open-loop load: inferences sent at fixed times whatever the answers (a paced rate, not clients waiting for their
last answer), on a few long-lived gRPC channels, each answer's latency counted from the time it was due to be sent
(so a stalled server shows in the latency instead of slowing the load: no coordinated omission).

One `OpenLoop` is driven by one thread (`run` of rate phases); answers arrive on gRPC's own threads through
`async_infer`'s callback and are kept as `Answer`s by phase.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import tritonclient.grpc as triton

from devtools.traffic import INPUT


@dataclass(frozen=True)
class Answer:
    """One request: the phase it was sent in, when it was due (time.monotonic()), how long until its answer, and
    its gRPC code ("OK", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", ...)."""

    phase: str
    due: float
    latency: float
    code: str


@dataclass(frozen=True)
class Phase:
    """`rate` requests a second for `seconds`, named for the report."""

    name: str
    rate: float
    seconds: float


def p99_ms(answers: Iterable[Answer]) -> float:
    """The 99th percentile latency of the answers, in ms (nan with fewer than 100)."""
    latencies = [a.latency for a in answers]
    return statistics.quantiles(latencies, n=100)[98] * 1000 if len(latencies) >= 100 else float("nan")


def p50_ms(answers: Iterable[Answer]) -> float:
    latencies = [a.latency for a in answers]
    return statistics.median(latencies) * 1000 if latencies else float("nan")


class OpenLoop:
    """Paced inferences to `model` through host:port `target` with authority `authority` (a Gateway hostname),
    round-robin over `channels` long-lived channels, each with a `timeout_s` deadline."""

    def __init__(self, target: str, model: str, authority: str, channels: int = 4, timeout_s: float = 10) -> None:
        options = [("grpc.use_local_subchannel_pool", 1), ("grpc.default_authority", authority)]
        self.model = model
        self.timeout_s = timeout_s
        self.clients = [triton.InferenceServerClient(target, channel_args=options) for _ in range(channels)]
        self.inputs = [triton.InferInput("image", list(INPUT[:1].shape), "FP32") for _ in self.clients]
        for request in self.inputs:
            request.set_data_from_numpy(INPUT[:1])
        self.answers: list[Answer] = []
        self.phase = ""
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._in_flight = 0
        self._idle = threading.Condition(self._lock)

    def run(self, phases: Sequence[Phase]) -> None:
        """Send every phase's requests on schedule, one after the other (until `stop`), then wait for the last
        answers (at most the deadline)."""
        due = time.monotonic()
        sent = 0
        for phase in phases:
            self.phase = phase.name
            end = due + phase.seconds
            while due < end and not self.stop.is_set():
                delay = due - time.monotonic()
                if delay > 0 and self.stop.wait(delay):
                    break
                self._send(phase.name, due, sent)
                sent += 1
                due += 1 / phase.rate
            if self.stop.is_set():
                break
        with self._idle:
            self._idle.wait_for(lambda: self._in_flight == 0, timeout=self.timeout_s + 5)

    def in_phase(self, *names: str) -> list[Answer]:
        with self._lock:
            return [a for a in self.answers if a.phase in names]

    def close(self) -> None:
        for client in self.clients:
            client.close()

    def _send(self, phase: str, due: float, n: int) -> None:
        def done(result: object, error: triton.InferenceServerException | None) -> None:
            code = "OK" if error is None else str(error.status() or "UNKNOWN").replace("StatusCode.", "")
            with self._idle:
                self.answers.append(Answer(phase, due, time.monotonic() - due, code))
                self._in_flight -= 1
                self._idle.notify_all()

        with self._lock:
            self._in_flight += 1
        index = n % len(self.clients)
        self.clients[index].async_infer(self.model, [self.inputs[index]], callback=done, client_timeout=self.timeout_s)
