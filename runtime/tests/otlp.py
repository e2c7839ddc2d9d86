"""A real OTLP/gRPC trace receiver for tests: the collector's TraceService on 127.0.0.1, keeping every span sent."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as otlp_grpc


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, object]
    links: tuple[tuple[str, str], ...]  # (trace id, span id)
    status_code: int
    service: str


def _value(value: object) -> object:
    which = value.WhichOneof("value")  # type: ignore[attr-defined]
    return getattr(value, which) if which else None


class Receiver(otlp_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()

    def Export(self, request: otlp.ExportTraceServiceRequest, context: object) -> otlp.ExportTraceServiceResponse:
        got = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    got.append(
                        ReceivedSpan(
                            span.name,
                            span.trace_id.hex(),
                            span.span_id.hex(),
                            span.parent_span_id.hex(),
                            span.start_time_unix_nano,
                            span.end_time_unix_nano,
                            {a.key: _value(a.value) for a in span.attributes},
                            tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
                            span.status.code,
                            str(resource.get("service.name")),
                        )
                    )
        with self._lock:
            self.spans += got
        return otlp.ExportTraceServiceResponse()

    def wait_for(self, found: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 15) -> list[ReceivedSpan]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                spans = list(self.spans)
            if found(spans):
                return spans
            time.sleep(0.05)
        raise AssertionError(f"spans not received within {timeout_s} s; got {[s.name for s in self.spans]}")


@contextmanager
def otlp_receiver() -> Iterator[tuple[Receiver, str]]:
    """A running receiver and its endpoint URL (http://127.0.0.1:PORT)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    receiver = Receiver()
    otlp_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield receiver, f"http://127.0.0.1:{port}"
    finally:
        server.stop(0)
