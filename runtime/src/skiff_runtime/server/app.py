"""The runtime process: inference + health on the gRPC port, health alone on the plaintext health port (its own
asyncio server on its own thread and event loop, so request handling never delays a probe), Prometheus metrics on
the metrics port.

Lifecycle: ports open at once with health NOT_SERVING; the workers load and warm the model; health turns
SERVING. SIGTERM/SIGINT (the pod's preStop sleep has run by then, so Services and gateways no longer send
new connections here): health NOT_SERVING, GOAWAY on every gRPC connection at once and REST keep-alive
connections closed after their current request, every call already sent answered within the grace period,
exit 0. A model that cannot load exits 1 (Kubernetes restarts the pod and the last log line
says why). A worker process that dies is replaced (health is NOT_SERVING while no worker can run a batch); one
that cannot be replaced exits 1.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from skiff_runtime.metrics import RuntimeMetrics
from skiff_runtime.payload_log import PayloadLog
from skiff_runtime.proto import inference_pb2
from skiff_runtime.server import tfserving
from skiff_runtime.server.auth import BearerTokenAuth, TokenFile
from skiff_runtime.server.health import HEALTH_REQUEST_BYTES, MAX_WATCH_STREAMS, ModelHealth
from skiff_runtime.server.peers import PeerCap
from skiff_runtime.server.pin import VersionPin
from skiff_runtime.server.receive import add_handlers, bounded, capture, small
from skiff_runtime.server.reflection import add_reflection
from skiff_runtime.server.rest import RestServer
from skiff_runtime.server.rpcs import RpcObserver
from skiff_runtime.server.servicer import InferenceServicer, register
from skiff_runtime.server.shadow import ShadowSwitch
from skiff_runtime.server.status_codes import ErrorInterceptor
from skiff_runtime.server.tls import ReloadingCredentials, ReloadingSslContext, TlsFiles
from skiff_runtime.service import ModelService
from skiff_runtime.settings import RuntimeSettings
from skiff_runtime.termination import termination_message, write_termination_message
from skiff_runtime.tracing import Tracing
from skiff_runtime.workers.base import WorkerEvent, WorkerEvents, Workers

log = logging.getLogger(__name__)

# Builds the workers; the callback hears when a worker process exits and when its replacement is ready.
WorkersFactory = Callable[[WorkerEvents], Workers]


def _channel_options(settings: RuntimeSettings) -> list[tuple[str, int]]:
    options = [
        ("grpc.max_receive_message_length", settings.max_message_bytes),
        ("grpc.max_send_message_length", settings.max_message_bytes),
        ("grpc.max_concurrent_streams", settings.max_streams_per_connection),
        ("grpc.so_reuseport", 0),
    ]
    if settings.max_connection_age_s:
        # GOAWAY after this age: long-lived client connections move to other pods as they scale, and calls on
        # the closing connection get the grace to finish.
        options += [
            ("grpc.max_connection_age_ms", int(settings.max_connection_age_s * 1000)),
            ("grpc.max_connection_age_grace_ms", int(settings.max_connection_age_grace_s * 1000)),
        ]
    return options


class RuntimeServer:
    """Owns the gRPC servers, the model service, health and metrics."""

    def __init__(self, settings: RuntimeSettings, workers_factory: WorkersFactory) -> None:
        self.settings = settings
        self.metrics = RuntimeMetrics(settings.model_name, settings.model_version)
        workers = workers_factory(self._worker_event)
        self.service = ModelService(
            settings.model_name,
            settings.model_version,
            workers,
            settings.batching,
            self.metrics.observe_batch,
            settings.max_request_bytes,
        )
        self.metrics.track_queue_depth(lambda: self.service.queue_depth)
        self.metrics.track_request_bytes(lambda: self.service.budget.held)
        self.metrics.workers.set(workers.count)
        if settings.device.kind == "gpu":
            self.metrics.watch_gpus()
        self.health = ModelHealth(settings.model_name)
        self.rpcs = RpcObserver(self.metrics.observe_rpc, self.metrics.observe_shadow_rpc)
        # Past this many RPCs in flight gRPC's core answers RESOURCE_EXHAUSTED itself, before Python reads the
        # message: overload is refused in microseconds instead of after decoding megabytes. The bound covers
        # a full queue plus a full batch per worker, so the batcher's own QueueFull still fires first.
        limits = settings.batching
        self.max_concurrent_rpcs = limits.max_queue_size + workers.count * limits.max_batch_size + 16
        # One client address has at most this many calls open (held calls included): half of the queue, the
        # smaller of the shared places (an inference call holds a queue place while its message arrives), so one
        # address can never take the rest from the others. Behind a gateway each gateway pod is one address.
        self.max_calls_per_peer = settings.max_calls_per_peer or max(1, limits.max_queue_size // 2)
        interceptors: list[grpc.aio.ServerInterceptor] = [self.rpcs, PeerCap(self.max_calls_per_peer)]
        token = TokenFile(settings.auth_token_file) if settings.auth_token_file is not None else None
        if token is not None:
            interceptors.append(BearerTokenAuth(token))
        interceptors.append(VersionPin(settings.model_name, settings.model_version))  # after auth: names no version
        interceptors.append(ErrorInterceptor())
        self.grpc_server = grpc.aio.server(
            interceptors=interceptors,
            options=_channel_options(settings),
            maximum_concurrent_rpcs=self.max_concurrent_rpcs,
        )
        # Request traces when --trace-endpoint names a collector; else None, and no SDK object on the request path.
        self.tracing = (
            Tracing(settings.tracing, settings.model_name, settings.model_version) if settings.tracing.enabled else None
        )
        # Sampled request/response logging when --payload-log-ratio is above 0; else None, nothing on the path.
        self.payloads = (
            PayloadLog(
                settings.payload_log,
                settings.model_name,
                settings.model_version,
                self.metrics.count_payload_records,
            )
            if settings.payload_log.enabled
            else None
        )
        # Shadow traffic: with --shadow-file, a sample of the answered requests is copied to the candidate it names.
        self.shadow = (
            ShadowSwitch(
                settings.shadow_file,
                settings.model_name,
                settings.model_version,
                token,
                identity=(settings.tls_cert_file, settings.tls_key_file)
                if settings.tls_cert_file is not None and settings.tls_key_file is not None
                else None,
            )
            if settings.shadow_file is not None
            else None
        )
        if self.shadow is not None:
            shadow = self.shadow
            self.metrics.track_shadow(lambda: shadow.tallies)
        servicer = InferenceServicer(
            self.service, settings.receive_timeout_s, self.tracing, payloads=self.payloads, shadow=self.shadow
        )
        register(servicer, self.grpc_server)
        # TensorFlow Serving's Predict, GetModelMetadata and GetModelStatus, onto the same service.
        tfserving.register(self.service, self.grpc_server, settings.receive_timeout_s, self.tracing, self.payloads)
        # Health on the inference port: each call reads its message within the receive timeout, a message past a
        # service name's size is refused unparsed, and Watch streams are capped so they cannot hold the server's
        # concurrent-RPC places.
        service, handlers = capture(health_pb2_grpc.add_HealthServicer_to_server, self.health.servicer)
        handlers = bounded(small(handlers, HEALTH_REQUEST_BYTES), settings.receive_timeout_s, MAX_WATCH_STREAMS)
        add_handlers(self.grpc_server, service, handlers)
        # Reflection lists and describes every service of the inference port (grpcurl needs no .proto files).
        self.reflected = add_reflection(
            self.grpc_server,
            [
                inference_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"],
                health_pb2.DESCRIPTOR.services_by_name["Health"],
                *tfserving.SERVICES,
            ],
            settings.receive_timeout_s,
        )
        self.tls = (
            ReloadingCredentials(TlsFiles(settings.tls_cert_file, settings.tls_key_file, settings.tls_client_ca_file))
            if settings.tls_cert_file is not None and settings.tls_key_file is not None
            else None
        )
        # V2 REST on the HTTP port: the same service, TLS files and token as the inference port.
        self.rest = (
            RestServer(
                self.service,
                max_body_bytes=settings.max_message_bytes,
                receive_timeout_s=settings.receive_timeout_s,
                token=token,
                ssl_context=ReloadingSslContext(self.tls.files).context if self.tls is not None else None,
                observe=self.metrics.observe_http,
                tracing=self.tracing,
                payloads=self.payloads,
                shadow=self.shadow,
            )
            if settings.http_port is not None
            else None
        )
        self.http_port = 0
        self.grpc_port = 0
        self.health_port = 0
        self.metrics_port = 0
        self._stopping = asyncio.Event()
        self._background: set[asyncio.Task[None]] = set()
        self.exit_code = 0

    async def start(self) -> None:
        await self.health.set_serving(False)
        host = self.settings.host
        address = f"{host}:{self.settings.grpc_port}"
        if self.tls is not None:
            self.grpc_port = self.grpc_server.add_secure_port(address, self.tls.server_credentials())
        else:
            self.grpc_port = self.grpc_server.add_insecure_port(address)
        self.health_port = self.health.probes.start(f"{host}:{self.settings.health_port}")
        await self.grpc_server.start()
        self.metrics_port = self.metrics.serve(host, self.settings.metrics_port)
        if self.rest is not None and self.settings.http_port is not None:
            self.http_port = await self.rest.start(host, self.settings.http_port, self.settings.grace_period_s)
        if self.shadow is not None:
            task = asyncio.get_running_loop().create_task(self.shadow.run())
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        log.info(
            "listening",
            extra={
                "grpc_port": self.grpc_port,
                "health_port": self.health_port,
                "metrics_port": self.metrics_port,
                "http_port": self.http_port,
                "model": self.settings.model_name,
                "tls": "mutual" if self.settings.tls_client_ca_file else ("on" if self.tls else "off"),
                "auth": "bearer" if self.settings.auth_token_file else "off",
            },
        )

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)

    def _fail(self, reason: str, **details: object) -> None:
        log.error(reason, extra={"model": self.service.name, **details})
        self.exit_code = 1
        self.request_stop()

    def _worker_event(self, event: WorkerEvent) -> None:
        """A worker exited or was replaced: health says SERVING only while some worker can run a batch; a worker
        the pool cannot replace stops the server (exit 1) so that Kubernetes restarts the pod."""
        self.metrics.workers.set(event.alive)
        if event.engine_cache is not None:
            self.metrics.engine_cache.labels(event.engine_cache).inc()
        if event.exitcode is not None or event.gave_up:
            self.metrics.worker_exits.inc()
        if event.gave_up:
            self._fail("worker process cannot be replaced; stopping so the pod restarts", worker=event.index,
                       exitcode=event.exitcode)  # fmt: skip
            return
        if self.service.ready:
            task = asyncio.get_running_loop().create_task(self.health.set_serving(event.alive > 0))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def load_model(self) -> None:
        try:
            await self.service.load()
        except Exception as exc:
            write_termination_message(termination_message(str(exc)))  # the pod's status says why (GPUUnavailable)
            self._fail("model failed to load; exiting", error=str(exc))
            return
        finally:
            # Paddle installs its own SIGTERM handler when it is first imported (on the inference thread):
            # take SIGTERM back so shutdown stays graceful.
            self.install_signal_handlers()
        await self.health.set_serving(True)
        self.metrics.set_ready(True)

    def request_stop(self) -> None:
        self._stopping.set()

    async def stop(self) -> None:
        """The drain: health NOT_SERVING, GOAWAY on every gRPC connection and no REST keep-alive past its
        current request (both at once), in-flight calls answered within the grace period, then the model stops."""
        grace = self.settings.grace_period_s
        log.info("shutting down", extra={"grace_period_s": grace})
        await self.health.shut_down()
        self.metrics.set_ready(False)
        loop = asyncio.get_running_loop()
        started = loop.time()
        # gRPC's core stops listening and sends GOAWAY on every connection now: clients open their next calls on
        # a new connection (another pod, behind a Service) while the calls they already sent here run to the end.
        # The model keeps serving those: nothing that reaches a handler is refused.
        drains = [asyncio.create_task(self.grpc_server.stop(grace))]
        if self.rest is not None:
            drains.append(asyncio.create_task(self.rest.stop()))
        # Streams (health Watch) never end by themselves: once the unary calls are answered, cut them.
        if await self.rpcs.wait_idle(grace):
            await self.grpc_server.stop(0)
        else:
            log.warning("grace period over with requests in flight", extra={"in_flight": self.rpcs.in_flight})
        await asyncio.gather(*drains)
        log.info("drained", extra={"seconds": round(loop.time() - started, 3)})
        background = list(self._background)
        for task in background:
            task.cancel()  # the shadow file's watch (and its mirror) among them
        await asyncio.gather(*background, return_exceptions=True)
        self.service.stop()
        self.health.probes.stop()
        await self.service.close()
        if self.tracing is not None:
            await loop.run_in_executor(None, self.tracing.shutdown)  # the spans still buffered leave now
        if self.payloads is not None:
            await loop.run_in_executor(None, self.payloads.close)  # the lines still queued are written now
        log.info("stopped")

    async def serve(self) -> int:
        """Run until SIGTERM or SIGINT (or a failed model load); returns the process exit code."""
        self.install_signal_handlers()
        await self.start()
        loader = asyncio.create_task(self.load_model())
        await self._stopping.wait()
        loader.cancel()
        await self.stop()
        return self.exit_code


async def run_server(settings: RuntimeSettings, workers_factory: WorkersFactory) -> int:
    """Build the server inside the running loop (grpc.aio binds to it) and serve until a stop signal."""
    return await RuntimeServer(settings, workers_factory).serve()
