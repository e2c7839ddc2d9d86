"""Payload records without a server: the sampler and its token bucket on a fake clock, the bounded copies, the
replayable request JSON (decoded again by the REST codec to the same tensors), and bodies cut to the limit."""

from __future__ import annotations

import json

import numpy as np
import pytest

from skiff_runtime.payloads import (
    Decision,
    PayloadRecord,
    Sampler,
    TokenBucket,
    body_json,
    copy_request,
    copy_response,
    copy_tensors,
    payload_line,
    trace_id_of,
)
from skiff_runtime.rest_codec import decode_infer_body
from skiff_runtime.tensors import Datatype, InferRequest, InferResponse, Tensor


def _request(rows: int = 1) -> InferRequest:
    features = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) / 4
    ids = np.arange(rows * 2, dtype=np.int64).reshape(rows, 2)
    return InferRequest(
        "two_io",
        "",
        "req-7",
        (Tensor("features", Datatype.FP32, features), Tensor("ids", Datatype.INT64, ids)),
        parameters={"skiff_timing": True, "binary_data_output": True},
    )


def test_the_bucket_allows_its_rate_and_refills_on_the_clock() -> None:
    bucket = TokenBucket.full(2.0, now=100.0)
    assert [bucket.take(100.0) for _ in range(3)] == [True, True, False]
    assert not bucket.take(100.4)  # 0.8 of a token
    assert bucket.take(100.5)
    assert bucket.take(110.0)
    assert bucket.take(110.0)
    assert not bucket.take(110.0)


def test_a_rate_under_one_still_lets_one_through_per_period() -> None:
    bucket = TokenBucket.full(0.5, now=0.0)
    assert bucket.take(0.0)
    assert not bucket.take(1.0)
    assert bucket.take(2.0)


def test_the_sampler_takes_the_ratio_then_the_rate() -> None:
    sampler = Sampler(0.25, TokenBucket.full(1.0, 0.0))
    assert sampler.decide(0.30, 0.0) is Decision.SKIP
    assert sampler.decide(0.10, 0.0) is Decision.LOG
    assert sampler.decide(0.10, 0.1) is Decision.RATE_LIMITED
    assert Sampler(0.0, TokenBucket.full(9.0, 0.0)).decide(0.0, 0.0) is Decision.SKIP
    assert Sampler(1.0, TokenBucket.full(9.0, 0.0)).decide(0.9999, 0.0) is Decision.LOG


def test_the_logged_request_is_a_rest_body_that_decodes_to_the_same_tensors() -> None:
    request = _request(rows=3)
    body, whole = body_json(copy_request(request, 65536), 65536)
    assert whole
    assert "binary_data_output" not in body["parameters"]  # the replay answers JSON
    replayed = decode_infer_body(json.dumps(body).encode(), None, "two_io", "", None).request
    assert replayed.id == "req-7"
    for mine, theirs in zip(request.inputs, replayed.inputs, strict=True):
        assert mine.name == theirs.name
        assert mine.datatype is theirs.datatype
        np.testing.assert_array_equal(mine.data, theirs.data)


def test_the_copy_owns_its_data() -> None:
    data = np.ones((2, 4), np.float32)
    [copy] = copy_tensors([Tensor("x", Datatype.FP32, data)], 1024)
    data[:] = 7
    assert copy.head.tolist() == [1.0] * 8
    assert copy.complete


def test_a_large_body_is_cut_to_the_limit_and_says_so() -> None:
    big = InferRequest("m", "", "", (Tensor("x", Datatype.FP32, np.random.rand(1000, 100).astype(np.float32)),))
    copy = copy_request(big, 4096)
    assert copy.tensors[0].head.size == 2048  # never more than max_bytes // 2 elements copied on the request path
    body, whole = body_json(copy, 4096)
    assert not whole
    assert len(json.dumps(body, separators=(",", ":"))) <= 4096
    [tensor] = body["inputs"]
    assert tensor["skiff_truncated_from"] == 100_000
    assert tensor["shape"] == [1000, 100]
    assert 0 < len(tensor["data"]) < 2048


def test_bytes_and_bf16_have_their_json_forms_or_say_they_have_none() -> None:
    text = np.empty(2, dtype=object)
    text[:] = [b"hello", "w\u00f6rld".encode()]
    raw = np.empty(1, dtype=object)
    raw[:] = [b"\xff\xfe"]
    response = InferResponse(
        "m",
        "1",
        "r",
        (
            Tensor("text", Datatype.BYTES, text),
            Tensor("raw", Datatype.BYTES, raw),
            Tensor("half", Datatype.BF16, np.zeros(2, np.uint16)),
        ),
    )
    record = PayloadRecord("grpc", "m", "1", 0, 5, "OK")
    body, whole = body_json(copy_response(response, 1024), 1024, record)
    assert not whole
    texts, raws, halves = body["outputs"]
    assert texts["data"] == ["hello", "w\u00f6rld"]
    assert "skiff_omitted" in raws
    assert "skiff_omitted" in halves


def test_nan_is_written_as_a_string_and_the_body_is_not_whole() -> None:
    request = InferRequest("m", "", "", (Tensor("x", Datatype.FP32, np.array([1.0, np.nan], np.float32)),))
    body, whole = body_json(copy_request(request, 1024), 1024)
    assert body["inputs"][0]["data"] == [1.0, "nan"]
    assert not whole


@pytest.mark.parametrize(
    ("carrier", "context", "expected"),
    [
        ({"traceparent": f"00-{'ab' * 16}-00f067aa0ba902b7-01"}, None, "ab" * 16),
        ({"traceparent": "garbage"}, None, ""),
        ({}, None, ""),
    ],
)  # fmt: skip
def test_the_trace_id_comes_from_the_traceparent(carrier: dict[str, str], context: object, expected: str) -> None:
    assert trace_id_of(carrier, context) == expected


def test_the_line_names_the_model_status_timing_and_the_cut_bodies() -> None:
    request = _request()
    response = InferResponse("two_io", "1", "req-7", (Tensor("y", Datatype.FP32, np.ones((1, 300), np.float32)),))
    record = PayloadRecord(
        "rest", "two_io", "1", 1_796_175_926_313_000_000, 1234, 200, "ab" * 16,
        request=copy_request(request, 256), response=copy_response(response, 256),
    )  # fmt: skip
    line = payload_line(record, 256)
    entry = json.loads(line.text)
    assert line.truncated
    assert b"\n" not in line.text
    assert entry["ts"] == "2026-12-02T01:45:26.313Z"
    assert (entry["kind"], entry["protocol"], entry["model"], entry["version"]) == ("payload", "rest", "two_io", "1")
    assert (entry["id"], entry["status"], entry["duration_us"], entry["trace_id"]) == ("req-7", 200, 1234, "ab" * 16)
    assert entry["truncated"] == ["response"]
    assert entry["response"]["outputs"][0]["skiff_truncated_from"] == 300


def test_a_nan_parameter_still_makes_a_line() -> None:
    request = InferRequest(
        "m", "", "i", (Tensor("x", Datatype.FP32, np.ones(2, np.float32)),), parameters={"p": np.nan}
    )
    line = payload_line(PayloadRecord("grpc", "m", "1", 0, 1, "OK", request=copy_request(request, 1000)), 1000)
    assert json.loads(line.text)["request"]["parameters"] == {"p": "nan"}
