"""grpc.health.v1 for the model: "" and the model's name follow the model's readiness, on two ports.

The inference port answers health from the asyncio servicer that shares the event loop with inference. The
plaintext health port, where kubelet probes go, is an asyncio gRPC server on an event loop of its own, in a thread
of its own: no request handling on the inference loop can delay a probe (only the GIL is shared, and the front's
longest step without releasing it is a bounded C-speed copy or parse).

No caller can fill the probe port for another. A call there holds no thread: every method runs when its headers
arrive and reads its one message within PROBE_RECEIVE_TIMEOUT_S (then DEADLINE_EXCEEDED), one client address has
at most PROBE_CALLS_PER_PEER calls open (then RESOURCE_EXHAUSTED, for that address only), Watch streams are capped
at MAX_WATCH_STREAMS, and messages are tiny. There is deliberately no port-wide cap on calls: any shared cap is a
place a crowd of callers could fill; what a call costs is a coroutine and an HTTP/2 stream for at most the
receive timeout, and the NetworkPolicy admits no pod to this port (kubelet probes come from the node).
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Coroutine
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from skiff_runtime.server.peers import per_peer
from skiff_runtime.server.receive import add_handlers, bounded, capture
from skiff_runtime.server.status_codes import ErrorInterceptor

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN

# Health Watch streams open at once on a port; past this a new one is refused RESOURCE_EXHAUSTED (Check answers).
MAX_WATCH_STREAMS = 4
# A probe call's message must arrive this soon after its headers (kubelet sends both at once, and gives up on a
# probe after timeoutSeconds, 1 s by default).
PROBE_RECEIVE_TIMEOUT_S = 1.0
# Calls one client address may have open on the probe port: kubelet has at most its startup, readiness and
# liveness probes of this pod in flight, each a fresh connection with one Check.
PROBE_CALLS_PER_PEER = 8
# A probe connection is closed after this long (GOAWAY; Watch clients reconnect). Kubelet opens one per probe.
PROBE_CONNECTION_AGE_MS = 300_000
PROBE_CONNECTION_GRACE_MS = 10_000
# A HealthCheckRequest is a service name: the probe port's gRPC limit, and the inference port's limit for health.
HEALTH_REQUEST_BYTES = 1024
PROBE_MAX_MESSAGE_BYTES = HEALTH_REQUEST_BYTES
# How long the probe thread may take to start, bind, stop or apply a status before that is an error.
PROBE_THREAD_TIMEOUT_S = 10.0

T = TypeVar("T")


class HealthServicer(health.aio.HealthServicer):  # type: ignore[misc]
    """grpc's asyncio health servicer with Watch mended: upstream drops a service's condition when any one of its
    watchers ends, and that service's other watchers never hear a change again. Here the condition stays while any
    watcher waits on it and goes with the last one (watching many names leaves nothing behind)."""

    def __init__(self) -> None:
        super().__init__()
        self._watching: Counter[str] = Counter()

    async def Watch(self, request: Any, context: grpc.aio.ServicerContext) -> None:  # noqa: N802
        service = request.service
        condition = self._server_watchers[service]
        self._watching[service] += 1
        last = None
        try:
            async with condition:
                while True:
                    status = self._server_status.get(service, SERVICE_UNKNOWN)
                    if status != last:
                        await context.write(health_pb2.HealthCheckResponse(status=status))
                        last = status
                    await condition.wait()
        finally:
            self._watching[service] -= 1
            if self._watching[service] <= 0:
                del self._watching[service]
                self._server_watchers.pop(service, None)


class ProbeServer:
    """The plaintext health port: an asyncio gRPC server and its health servicer, on an event loop in a thread of
    their own. Its methods are called from any other thread or event loop."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="skiff-health", daemon=True)
        self._thread.start()
        self.servicer = HealthServicer()  # touched only on the probe loop from here on
        self._server: grpc.aio.Server | None = None

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        """Runs `work` on the probe loop and waits for it (from a thread that is not the probe loop's)."""
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(PROBE_THREAD_TIMEOUT_S)

    async def set(self, service: str, status: Any) -> None:
        """Sets a service's status on the probe loop, awaited from the caller's event loop."""
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.servicer.set(service, status), self._loop))

    async def enter_graceful_shutdown(self) -> None:
        work = self.servicer.enter_graceful_shutdown()
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self._loop))

    def start(self, address: str) -> int:
        """Binds `address` ("host:port", port 0 for any) and serves; returns the port."""
        return self._run(self._start(address))

    async def _start(self, address: str) -> int:
        server = grpc.aio.server(
            interceptors=[ErrorInterceptor()],
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", PROBE_MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", PROBE_MAX_MESSAGE_BYTES),
                ("grpc.max_connection_age_ms", PROBE_CONNECTION_AGE_MS),
                ("grpc.max_connection_age_grace_ms", PROBE_CONNECTION_GRACE_MS),
            ],
        )
        service, handlers = capture(health_pb2_grpc.add_HealthServicer_to_server, self.servicer)
        handlers = per_peer(bounded(handlers, PROBE_RECEIVE_TIMEOUT_S, MAX_WATCH_STREAMS), PROBE_CALLS_PER_PEER)
        add_handlers(server, service, handlers)
        port: int = server.add_insecure_port(address)
        await server.start()
        self._server = server
        return port

    def stop(self) -> None:
        """Stops serving (open calls are cancelled) and ends the probe thread."""
        if self._server is not None:
            self._run(self._server.stop(0))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(PROBE_THREAD_TIMEOUT_S)
        self._loop.close()


class ModelHealth:
    """Health of one model, for the inference port (`servicer`, asyncio) and the probe port (`probes`)."""

    def __init__(self, model_name: str) -> None:
        self.servicer = HealthServicer()
        self.probes = ProbeServer()
        self.services = ("", model_name)

    async def set_serving(self, serving: bool) -> None:
        status = SERVING if serving else NOT_SERVING
        for service in self.services:
            await self.servicer.set(service, status)
            await self.probes.set(service, status)

    async def shut_down(self) -> None:
        """NOT_SERVING for every service, for good: later set() calls are ignored."""
        await self.servicer.enter_graceful_shutdown()
        await self.probes.enter_graceful_shutdown()
