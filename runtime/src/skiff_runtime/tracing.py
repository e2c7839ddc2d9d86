"""OpenTelemetry traces of inference requests: one span per request, continuing the caller's W3C `traceparent`, with
a child span per stage (receive and decode, queue wait, batch, engine run, encode), exported over OTLP/gRPC.

Built only when --trace-endpoint (or a standard OTEL_* variable, settings.OTEL_DEFAULTS) names a collector; the
transports hold None otherwise and create no span, context or SDK object on the request path (`traced` then just
awaits the handler). The request's span is started when its headers arrive (the sampling decision: parent-based,
else --trace-sampling-ratio); the stage spans are made when the request ends, from the moments
skiff_runtime.timing recorded, with those start and end times. The engine's moments are measured in the worker
process and carried back with its answer (workers/process.py BatchDone.finished_ns), so no trace context crosses
the worker hop and the worker runs no SDK. A batch span carries the batch's rows and requests and links to the
spans of the other traced requests it merged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TypeVar

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from skiff_runtime.settings import TracingSettings
from skiff_runtime.timing import RequestTimes, now_ns

T = TypeVar("T")
# The W3C trace-context headers (gRPC metadata keys are lower case; HTTP headers are matched case-insensitively).
TRACE_HEADERS = ("traceparent", "tracestate")


def carrier_of(pairs: Iterable[tuple[str, str | bytes]] | None) -> dict[str, str]:
    """The trace-context entries of gRPC metadata or HTTP headers, as the propagator reads them."""
    carrier: dict[str, str] = {}
    for key, value in pairs or ():
        name = key.lower()
        if name in TRACE_HEADERS and isinstance(value, str):
            carrier[name] = value
    return carrier


class Tracing:
    """The tracer of one runtime: its own TracerProvider (never the global one), a batching exporter (spans leave
    on the SDK's thread, never on the event loop) and the W3C propagator."""

    def __init__(
        self, settings: TracingSettings, model: str, version: str, exporter: SpanExporter | None = None
    ) -> None:
        resource = Resource.create(
            {"service.name": settings.trace_service_name, "skiff.model": model, "skiff.version": version}
        )
        sampler = ParentBased(TraceIdRatioBased(settings.trace_sampling_ratio))
        self._provider = TracerProvider(resource=resource, sampler=sampler)
        if exporter is None:
            endpoint = settings.trace_endpoint
            exporter = OTLPSpanExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"))
        self._provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=1000))
        self._tracer = self._provider.get_tracer("skiff_runtime")
        self._propagator = TraceContextTextMapPropagator()
        self.model = model

    def begin(self, name: str, carrier: Mapping[str, str], arrived: int, system: str) -> RequestTimes | None:
        """Start the request's span (a child of the caller's traceparent, if any); None when it is not sampled."""
        parent = self._propagator.extract(carrier) if carrier else None
        span = self._tracer.start_span(
            name,
            context=parent,
            kind=SpanKind.SERVER,
            start_time=arrived,
            attributes={"rpc.system": system, "rpc.method": name, "skiff.model": self.model},
        )
        if not span.is_recording():
            return None
        return RequestTimes(arrived, span=span, context=span.get_span_context())

    def end(self, times: RequestTimes, error: BaseException | None) -> None:
        """The stage spans from the request's moments, then the request's span, ended now."""
        span = times.span
        if not isinstance(span, Span):
            return
        ended = now_ns()
        parent = trace.set_span_in_context(span)
        self._child("receive", parent, times.arrived, times.decoded or ended)
        if times.enqueued:
            self._child("queue", parent, times.enqueued, times.batch_started or ended)
        if times.batch_started:
            links = [Link(c) for c in times.merged if isinstance(c, SpanContext)]
            batch = self._tracer.start_span(
                "batch",
                context=parent,
                start_time=times.batch_started,
                links=links,
                attributes={"skiff.batch.size": times.batch_rows, "skiff.batch.requests": times.batch_requests},
            )
            self._child("engine", trace.set_span_in_context(batch), times.engine_started, times.engine_ended)
            batch.end(end_time=times.batch_ended)
        if times.encoding:
            self._child("encode", parent, times.encoding, ended)
        if times.report:
            span.set_attribute("skiff.timing", True)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            span.set_attribute("error.type", type(error).__name__)
        span.end(end_time=ended)

    def _child(self, name: str, parent: object, start: int, end: int) -> None:
        child = self._tracer.start_span(name, context=parent, start_time=start)  # type: ignore[arg-type]
        child.end(end_time=max(start, end))

    def shutdown(self) -> None:
        """Send the spans still buffered and stop the exporter (the server's stop)."""
        self._provider.shutdown()


async def traced(
    tracing: Tracing | None,
    name: str,
    system: str,
    carrier: Callable[[], dict[str, str]],
    handle: Callable[[RequestTimes | None, int], Awaitable[T]],
) -> T:
    """`handle(times, arrived)` under the request's span when tracing is on and the request is sampled; else
    `handle(None, arrived)` (it may still make a RequestTimes for a request that asks for its timing)."""
    arrived = now_ns()
    if tracing is None:
        return await handle(None, arrived)
    times = tracing.begin(name, carrier(), arrived, system)
    if times is None:
        return await handle(None, arrived)
    try:
        result = await handle(times, arrived)
    except BaseException as exc:
        tracing.end(times, exc)
        raise
    tracing.end(times, None)
    return result
