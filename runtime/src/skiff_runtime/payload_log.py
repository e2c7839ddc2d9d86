"""Payload logging's I/O: a sampled request's copies go into a bounded queue on the request path (never waiting: a
full queue drops the record, counted), and one writer thread turns them into JSON lines (skiff_runtime.payloads)
and writes them to stdout or POSTs them to an HTTP endpoint in bounded batches with a short timeout (a slow or
failing endpoint loses lines, counted, never the request path's time).

Built only when --payload-log-ratio is above 0; the transports hold None otherwise and `logged` just awaits the
handler. Records never hold gRPC metadata or HTTP headers (tokens live there): only what payloads.PayloadRecord
names.
"""

from __future__ import annotations

import logging
import queue
import random
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import BinaryIO, TypeVar

from skiff_runtime.payloads import (
    BodyCopy,
    Decision,
    PayloadLine,
    PayloadRecord,
    Sampler,
    TokenBucket,
    copy_request,
    copy_response,
    payload_line,
    trace_id_of,
)
from skiff_runtime.settings import PayloadLogSettings
from skiff_runtime.tensors import InferRequest, InferResponse
from skiff_runtime.timing import RequestTimes, now_ns

log = logging.getLogger(__name__)
T = TypeVar("T")

# Records waiting for the writer. Each holds at most 4 x --payload-log-max-body-bytes a body (max_bytes // 2
# elements of at most 8 bytes), so the queue holds at most 512 x that (32 MiB at the default 64 KiB).
QUEUE_RECORDS = 64
# One POST carries at most this many lines or bytes, and gives up after the timeout (its lines are dropped).
POST_LINES = 256
POST_BYTES = 1 << 20
POST_TIMEOUT_S = 2.0
# A failing HTTP sink is reported at most this often (the count is in the metric).
WARN_EVERY_S = 60.0
# The results of skiff_payload_log_records_total: every sampled request ends as exactly one of written, dropped
# (the queue was full, or the sink failed) or rate_limited (over --payload-log-max-per-second); `truncated` counts
# the written lines with a body cut to --payload-log-max-body-bytes.
RESULTS = ("written", "dropped", "rate_limited", "truncated")

Count = Callable[[str, int], None]  # (result, how many)


@dataclass(slots=True, eq=False)
class Capture:
    """One logged request on its way: filled by the transport after decoding and before encoding."""

    protocol: str
    started_ns: int
    trace_id: str
    max_bytes: int
    request: BodyCopy | None = None
    response: BodyCopy | None = None

    def took(self, request: InferRequest, times: RequestTimes | None) -> None:
        """The decoded request (copied, bounded), and the trace id of its span if it is traced."""
        self.request = copy_request(request, self.max_bytes)
        if times is not None and times.context is not None:
            self.trace_id = trace_id_of({}, times.context) or self.trace_id

    def answered(self, response: InferResponse) -> None:
        self.response = copy_response(response, self.max_bytes)


class PayloadLog:
    """The sampler, the bounded queue and the writer thread of one runtime."""

    def __init__(
        self,
        settings: PayloadLogSettings,
        model: str,
        version: str,
        count: Count,
        out: BinaryIO | None = None,
        draw: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.model, self.version = model, version
        self._count = count
        self._out = out
        self._draw, self._clock = draw, clock
        self._sampler = Sampler(
            settings.payload_log_ratio, TokenBucket.full(settings.payload_log_max_per_second, clock())
        )
        self._queue: queue.Queue[PayloadRecord | None] = queue.Queue(QUEUE_RECORDS)
        self._warned = -WARN_EVERY_S
        for result in RESULTS:
            count(result, 0)
        self._thread = threading.Thread(target=self._write_all, name="payload-log", daemon=True)
        self._thread.start()

    def begin(self, protocol: str, carrier: Mapping[str, str]) -> Capture | None:
        """A Capture when this request is logged; None when it is not sampled or over the rate (counted)."""
        decision = self._sampler.decide(self._draw(), self._clock())
        if decision is Decision.RATE_LIMITED:
            self._count("rate_limited", 1)
        if decision is not Decision.LOG:
            return None
        return Capture(protocol, now_ns(), trace_id_of(carrier), self.settings.payload_log_max_body_bytes)

    def finish(self, capture: Capture, status: str | int, error: BaseException | None) -> None:
        """Queue the record without waiting; a full queue drops it (counted)."""
        record = PayloadRecord(
            capture.protocol,
            self.model,
            self.version,
            capture.started_ns,
            max(0, now_ns() - capture.started_ns) // 1000,
            status,
            capture.trace_id,
            "" if error is None else f"{type(error).__name__}: {str(error)[:500]}",
            capture.request,
            capture.response,
        )
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self._count("dropped", 1)

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is queued (within the timeout), then stop the writer (the server's stop)."""
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)

    def _write_all(self) -> None:
        """The writer thread: one line at a time to stdout; batches of what is queued for an HTTP sink. Ends at
        the None that close() queues, after what came before it."""
        http = self.settings.payload_log_sink.startswith(("http://", "https://"))
        stopping = False
        while not stopping:
            record = self._queue.get()
            if record is None:
                return
            batch = [record]
            while http and len(batch) < POST_LINES:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stopping = True  # after this batch
                    break
                batch.append(more)
            lines = self._lines(batch)
            written = self._post(lines) if http else self._print(lines)
            self._count("written", written)
            self._count("dropped", len(batch) - written)
            self._count("truncated", sum(line.truncated for line in lines[:written]))

    def _lines(self, batch: list[PayloadRecord]) -> list[PayloadLine]:
        """The records' lines; one that cannot be written (a bug: the writer must outlive it) is left out, logged."""
        lines = []
        for record in batch:
            try:
                lines.append(payload_line(record, self.settings.payload_log_max_body_bytes))
            except Exception:  # the writer thread keeps going; the record counts as dropped
                log.exception("payload line could not be built", extra={"protocol": record.protocol})
        return lines

    def _print(self, lines: list[PayloadLine]) -> int:
        out = self._out if self._out is not None else sys.stdout.buffer
        try:
            out.write(b"".join(line.text + b"\n" for line in lines))
            out.flush()
        except (OSError, ValueError):
            return 0
        return len(lines)

    def _post(self, lines: list[PayloadLine]) -> int:
        """POST the lines as application/x-ndjson, at most POST_BYTES a request; returns the lines accepted."""
        sent = 0
        while sent < len(lines):
            chunk: list[bytes] = []
            size = 0
            for line in lines[sent:]:
                if chunk and size + len(line.text) + 1 > POST_BYTES:
                    break
                chunk.append(line.text)
                size += len(line.text) + 1
            body = b"".join(text + b"\n" for text in chunk)
            # The sink is an http(s) URL: settings._sink refuses any other scheme.
            request = urllib.request.Request(  # noqa: S310
                self.settings.payload_log_sink,
                data=body,
                method="POST",
                headers={"Content-Type": "application/x-ndjson"},
            )
            try:
                with urllib.request.urlopen(request, timeout=POST_TIMEOUT_S) as answer:  # noqa: S310
                    answer.read(1024)
            except (OSError, urllib.error.URLError, ValueError) as exc:
                self._warn(exc)
                return sent
            sent += len(chunk)
        return sent

    def _warn(self, exc: BaseException) -> None:
        now = self._clock()
        if now - self._warned < WARN_EVERY_S:
            return
        self._warned = now
        url = urllib.parse.urlsplit(self.settings.payload_log_sink)  # no user:password@ in what is logged
        port = f":{url.port}" if url.port else ""
        log.warning(
            'payload log sink failed; lines are dropped (skiff_payload_log_records_total{result="dropped"})',
            extra={"sink": f"{url.scheme}://{url.hostname}{port}{url.path}", "error": type(exc).__name__},
        )


async def logged(
    payloads: PayloadLog | None,
    protocol: str,
    carrier: Callable[[], dict[str, str]],
    status_of: Callable[[BaseException | None], str | int],
    handle: Callable[[Capture | None], Awaitable[T]],
) -> T:
    """`handle(capture)` with the request logged when payload logging is on and it is sampled; else
    `handle(None)`."""
    if payloads is None:
        return await handle(None)
    capture = payloads.begin(protocol, carrier())
    if capture is None:
        return await handle(None)
    try:
        result = await handle(capture)
    except BaseException as exc:
        payloads.finish(capture, status_of(exc), exc)
        raise
    payloads.finish(capture, status_of(None), None)
    return result
