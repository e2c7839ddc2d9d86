"""prometheus: the runtime's own /metrics page parsed into inference counters, summed, subtracted, and p99 from
histogram buckets the way Prometheus' histogram_quantile computes it."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from skiff_operator.prometheus import (
    Counts,
    ExpositionError,
    ExpositionReader,
    LineTooLong,
    PageTooLarge,
    add,
    parse_exposition,
    quantile,
    subtract,
)
from skiff_runtime.metrics import SECONDS_BUCKETS, RuntimeMetrics

INFER = "/inference.GRPCInferenceService/ModelInfer"


def exposition(rpcs: list[tuple[str, str, float]]) -> str:
    """The text the real runtime serves on its metrics port after these RPCs."""
    metrics = RuntimeMetrics("demo", "v1")
    for method, code, seconds in rpcs:
        metrics.observe_rpc(method, code, seconds)
    return generate_latest(metrics.registry).decode()


def test_the_runtime_exposition_is_read_for_inference_methods_only() -> None:
    text = exposition(
        [
            (INFER, "OK", 0.004),
            (INFER, "OK", 0.004),
            (INFER, "UNAVAILABLE", 0.3),
            ("/tensorflow.serving.PredictionService/Predict", "INVALID_ARGUMENT", 0.0001),
            ("/inference.GRPCInferenceService/ServerReady", "OK", 0.0001),
            ("/grpc.health.v1.Health/Check", "OK", 0.0001),
        ]
    )
    counts = parse_exposition(text)
    assert counts.codes == {"OK": 2, "UNAVAILABLE": 1, "INVALID_ARGUMENT": 1}
    assert counts.requests == 4
    assert counts.errors({"UNAVAILABLE", "INTERNAL"}) == 1
    assert counts.buckets["+Inf"] == 4
    assert counts.buckets["0.005"] == 3  # ModelInfer 2 x 4ms + Predict 0.1ms
    assert set(counts.buckets) == {*(str(b) for b in SECONDS_BUCKETS), "+Inf"}


def test_a_runtime_that_served_nothing_reads_as_empty() -> None:
    counts = parse_exposition(exposition([]))
    assert (counts.codes, counts.buckets, counts.handling_seconds) == ({}, {}, 0.0)
    assert counts.cpu_pods == 1  # the runtime exports its CPU time from the start
    assert quantile(0.99, counts.buckets) is None


def test_labels_with_escapes_and_timestamps_parse() -> None:
    text = (
        '# HELP x y\ngrpc_server_handled_total{grpc_service="a\\"b",grpc_method="ModelInfer",grpc_code="OK"} 3.0 '
        "1700000000000\nother_metric 1\n"
    )
    assert parse_exposition(text).codes == {"OK": 3}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<html>not metrics</html>", "not a Prometheus sample"),
        ('grpc_server_handled_total{grpc_method="ModelInfer",grpc_code="OK"} lots', "not a number"),
        ('grpc_server_handled_total{grpc_method="ModelInfer",grpc_code="OK"} -1', "cannot be"),
        ('grpc_server_handled_total{grpc_method="ModelInfer",grpc_code="OK"} 1e999', "cannot be"),
        ('grpc_server_handled_total{grpc_method="ModelInfer",grpc_code="OK"} +Inf', "cannot be"),
    ],
)
def test_a_page_that_is_not_metrics_is_an_error(text: str, message: str) -> None:
    with pytest.raises(ExpositionError, match=message):
        parse_exposition(text)


def test_an_error_names_the_line_but_never_repeats_the_page() -> None:
    with pytest.raises(ExpositionError) as raised:
        parse_exposition("ok 1\n<script>steal()</script>\n")
    assert str(raised.value) == "line 2 is not a Prometheus sample"


@pytest.mark.parametrize("size", [1, 7, 4096])
def test_a_page_streamed_in_chunks_of_any_size_reads_as_the_whole_page(size: int) -> None:
    page = exposition([(INFER, "OK", 0.004)] * 3 + [(INFER, "INTERNAL", 0.2)]).encode()
    reader = ExpositionReader(max_bytes=len(page), max_line_bytes=200)
    for start in range(0, len(page), size):
        reader.feed(page[start : start + size])
    assert reader.close() == parse_exposition(page.decode())
    assert reader.close().codes == {"OK": 3, "INTERNAL": 1}


def test_the_byte_cap_holds_while_streaming_and_the_page_at_the_cap_is_read() -> None:
    page = exposition([(INFER, "OK", 0.004)]).encode()
    at_cap = ExpositionReader(max_bytes=len(page), max_line_bytes=200)
    at_cap.feed(page)
    assert at_cap.close().codes == {"OK": 1}
    over = ExpositionReader(max_bytes=len(page) - 1, max_line_bytes=200)
    with pytest.raises(PageTooLarge):
        over.feed(page)


def test_the_line_cap_holds_within_a_chunk_and_across_chunks() -> None:
    within = ExpositionReader(max_bytes=10_000, max_line_bytes=100)
    with pytest.raises(LineTooLong, match="line 2 is over 100 bytes"):
        within.feed(b"ok 1\n# " + b"x" * 200 + b"\nok 2\n")
    across = ExpositionReader(max_bytes=10_000, max_line_bytes=100)
    for _ in range(10):
        across.feed(b"# xxxxxxxx")  # no newline: the partial line grows to the cap...
    with pytest.raises(LineTooLong):
        across.feed(b"x")  # ...and past it
    exactly = ExpositionReader(max_bytes=10_000, max_line_bytes=100)
    exactly.feed(b"# " + b"x" * 98 + b"\n")
    assert exactly.close() == Counts()


@pytest.mark.parametrize(
    "line",
    [
        'a{b="' + "} 1 " * 1000 + "x y",  # each `}` a place a greedy `\\{(.*)\\}` backtracked to: 7 ms a line
        "a{" + '"' * 4000 + "} 1 x",
    ],
)
def test_a_page_of_hostile_lines_is_refused_without_backtracking(line: str) -> None:
    # 256 of them are a 1 MiB page: 1.8 s of the event loop with the greedy pattern, about a millisecond now.
    started = time.perf_counter()
    for _ in range(256):
        with pytest.raises(ExpositionError, match="not a Prometheus sample"):
            ExpositionReader(max_bytes=1 << 20, max_line_bytes=4096).feed((line + "\n").encode())
    assert time.perf_counter() - started < 0.5


def test_pods_add_up_and_reads_subtract() -> None:
    one = Counts({"OK": 5}, {"0.01": 4, "+Inf": 5})
    two = Counts({"OK": 1, "INTERNAL": 2}, {"0.01": 3, "+Inf": 3})
    total = add([one, two])
    assert total == Counts({"OK": 6, "INTERNAL": 2}, {"0.01": 7, "+Inf": 8})
    assert subtract(total, one) == Counts({"OK": 1, "INTERNAL": 2}, {"0.01": 3, "+Inf": 3})


def test_a_counter_that_went_down_is_a_reset_not_a_negative_delta() -> None:
    assert subtract(Counts({"OK": 2}), Counts({"OK": 5})) is None


@pytest.mark.parametrize(
    ("buckets", "p99"),
    [
        ({"0.01": 100, "+Inf": 100}, 0.0099),  # all in the first bucket: 0..10ms, rank 99 of 100
        ({"0.01": 50, "0.02": 100, "+Inf": 100}, 0.0198),  # 10..20ms holds ranks 50..100
        ({"0.01": 0, "0.02": 0, "0.05": 100, "+Inf": 100}, 0.0497),
        ({"0.01": 90, "10.0": 90, "+Inf": 100}, 10.0),  # rank in +Inf: the highest finite bound
        ({"+Inf": 0}, None),
        ({}, None),
    ],
)
def test_p99_from_buckets(buckets: dict[str, int], p99: float | None) -> None:
    result = quantile(0.99, buckets)
    if p99 is None:
        assert result is None
    else:
        assert result is not None
        assert math.isclose(result, p99, rel_tol=1e-9)


def test_p99_of_the_runtime_histogram_lands_in_the_right_bucket() -> None:
    text = exposition([(INFER, "OK", 0.003)] * 990 + [(INFER, "OK", 0.4)] * 10)
    p99 = quantile(0.99, parse_exposition(text).buckets)
    assert p99 is not None
    assert 0.002 < p99 <= 0.005


def test_the_handling_time_of_inference_rpcs_and_rest_infers_is_summed_and_nothing_else() -> None:
    pages = Path(__file__).parent / "pages"
    busy = parse_exposition((pages / "runtime-busy.txt").read_text())
    idle = parse_exposition((pages / "runtime-idle.txt").read_text())
    assert busy.handling_seconds == 14.0  # ModelInfer 10 s + REST infer 4 s; health and ModelReady left out
    assert idle.handling_seconds == 0.0
    assert add([busy, busy]).handling_seconds == 28.0
    delta = subtract(busy, idle)
    assert delta is not None
    assert delta.handling_seconds == 14.0
    assert subtract(idle, busy) is None  # the sum went back: a pod restarted


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-1", "x"])
def test_a_handling_time_sum_that_is_not_a_time_is_refused(value: str) -> None:
    with pytest.raises(ExpositionError, match="line 1"):
        parse_exposition(f'grpc_server_handling_seconds_sum{{grpc_method="ModelInfer"}} {value}\n')


def test_the_runtimes_cpu_time_and_every_gpus_utilisation_are_kept_and_add_up_over_pods() -> None:
    page = (
        "# TYPE skiff_cpu_seconds_total counter\nskiff_cpu_seconds_total 12.5\n"
        'gpu_utilization{gpu="0",uuid="GPU-a"} 80.0\ngpu_utilization{gpu="1",uuid="GPU-b"} 40.0\n'
        'gpu_memory_used_bytes{gpu="0",uuid="GPU-a"} 1e9\n'
    )
    pod = parse_exposition(page)
    assert (pod.cpu_seconds, pod.cpu_pods, pod.gpu_percent, pod.gpus) == (12.5, 1, 120.0, 2)
    cpu_only = parse_exposition("skiff_cpu_seconds_total 2.5\n")
    both = add([pod, cpu_only, parse_exposition("")])  # the last: a page without CPU time
    assert (both.cpu_seconds, both.cpu_pods, both.gpu_percent, both.gpus) == (15.0, 2, 120.0, 2)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("skiff_cpu_seconds_total -3", "cannot be NaN, infinite or negative"),
        ('gpu_utilization{gpu="0"} 140', "percentage from 0 to 100"),
        ('gpu_utilization{gpu="0"} busy', "not a number"),
    ],
)
def test_a_cpu_time_or_gpu_utilisation_out_of_range_is_refused(line: str, message: str) -> None:
    with pytest.raises(ExpositionError, match=message):
        parse_exposition(line + "\n")
