"""PayloadLog in process: sampled records become lines on the given stream, a queue past its bound drops at once
(counted), and a failing HTTP sink drops its lines with a warning that names the sink without its credentials."""

from __future__ import annotations

import io
import json
import logging
import socket
import threading
from collections import Counter

import numpy as np
import pytest

from skiff_runtime.payload_log import QUEUE_RECORDS, PayloadLog
from skiff_runtime.settings import PayloadLogSettings
from skiff_runtime.tensors import Datatype, InferRequest, InferResponse, Tensor


def _counts() -> tuple[Counter[str], object]:
    counts: Counter[str] = Counter()

    def count(result: str, n: int) -> None:
        counts[result] += n

    return counts, count


def _log_one(payloads: PayloadLog, request_id: str) -> None:
    capture = payloads.begin("grpc", {})
    assert capture is not None
    capture.took(InferRequest("m", "", request_id, (Tensor("x", Datatype.FP32, np.ones((1, 2), np.float32)),)), None)
    capture.answered(InferResponse("m", "1", request_id, (Tensor("y", Datatype.INT64, np.array([7])),)))
    payloads.finish(capture, "OK", None)


def test_records_become_lines_and_the_rate_limit_is_counted() -> None:
    counts, count = _counts()
    out = io.BytesIO()
    clock = iter([0.0, 0.0, 0.0, 0.0, 0.0])
    payloads = PayloadLog(PayloadLogSettings(1.0, 4096, 2.0, "stdout"), "m", "1", count, out, clock=lambda: next(clock))
    _log_one(payloads, "a")
    _log_one(payloads, "b")
    assert payloads.begin("grpc", {}) is None  # the bucket (2 a second, burst 2) is empty at the same moment
    payloads.close()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["id"] for line in lines] == ["a", "b"]
    assert lines[0]["response"]["outputs"][0]["data"] == [7]
    assert counts == Counter({"written": 2, "rate_limited": 1})


def test_a_full_queue_drops_at_once() -> None:
    counts, count = _counts()
    gate = threading.Event()

    class Stuck(io.BytesIO):
        def write(self, data: bytes) -> int:  # type: ignore[override]
            gate.wait(10)
            return len(data)

    payloads = PayloadLog(PayloadLogSettings(1.0, 4096, 1e5, "stdout"), "m", "1", count, Stuck())
    for i in range(QUEUE_RECORDS + 10):
        _log_one(payloads, str(i))
    assert counts["dropped"] >= 9  # the writer holds one, the queue 64: the rest were dropped, not waited for
    gate.set()
    payloads.close()
    assert counts["written"] + counts["dropped"] == QUEUE_RECORDS + 10


def test_a_failing_http_sink_drops_with_a_warning_that_shows_no_credentials(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connections are refused
    counts, count = _counts()
    sink = f"http://user:s3cr3t-pass@127.0.0.1:{port}/in"
    payloads = PayloadLog(PayloadLogSettings(1.0, 4096, 1e5, sink), "m", "1", count)
    with caplog.at_level(logging.WARNING, logger="skiff_runtime.payload_log"):
        _log_one(payloads, "a")
        payloads.close()
    assert counts["dropped"] == 1
    assert counts["written"] == 0
    [record] = caplog.records
    assert record.sink == f"http://127.0.0.1:{port}/in"  # type: ignore[attr-defined]
    assert "s3cr3t" not in caplog.text
    assert "s3cr3t" not in str(vars(record))
