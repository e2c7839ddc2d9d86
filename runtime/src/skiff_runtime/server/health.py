"""grpc.health.v1 for the model: "" and the model's name follow the model's readiness, on two ports.

The inference port answers health from the asyncio servicer that shares the event loop with inference. The
plaintext health port, where kubelet probes go, is a separate thread-pool gRPC server with its own servicer: no
request handling on the event loop can delay a probe (only the GIL is shared, and the front's longest step
without releasing it is a bounded C-speed copy or parse).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

# The probe server's threads, and how many of them Watch streams may hold (each holds one while open): the
# rest always answer Check.
PROBE_THREADS = 8
MAX_WATCH_STREAMS = 4
# A probe connection is closed after this long (GOAWAY; Watch clients reconnect), so a call that sent headers and
# never its message holds a probe thread at most this long plus the grace. Kubelet opens a connection per probe.
PROBE_CONNECTION_AGE_MS = 300_000
PROBE_CONNECTION_GRACE_MS = 10_000
PROBE_MAX_MESSAGE_BYTES = 4096


class _ProbeServicer(health.HealthServicer):  # type: ignore[misc]
    """The thread-safe health servicer, with Watch streams capped so they never take every probe thread."""

    def __init__(self, max_watches: int) -> None:
        super().__init__(experimental_non_blocking=False)
        self._watches = threading.BoundedSemaphore(max_watches)
        self.max_watches = max_watches

    def Watch(self, request: Any, context: grpc.ServicerContext, send_response_callback: Any = None) -> Iterator[Any]:  # noqa: N802
        if not self._watches.acquire(blocking=False):
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{self.max_watches} health Watch streams are open, the most this port keeps; poll with Check",
            )
        try:
            yield from super().Watch(request, context, send_response_callback)
        finally:
            self._watches.release()


class ModelHealth:
    """Health of one model, for the inference port (`servicer`, asyncio) and the probe port (`probes`)."""

    def __init__(self, model_name: str) -> None:
        self.servicer = health.aio.HealthServicer()
        self.probes = _ProbeServicer(MAX_WATCH_STREAMS)
        self.services = ("", model_name)

    async def set_serving(self, serving: bool) -> None:
        status = SERVING if serving else NOT_SERVING
        for service in self.services:
            await self.servicer.set(service, status)
            self.probes.set(service, status)

    async def shut_down(self) -> None:
        """NOT_SERVING for every service, for good: later set() calls are ignored."""
        await self.servicer.enter_graceful_shutdown()
        self.probes.enter_graceful_shutdown()

    def probe_server(self) -> grpc.Server:
        """The plaintext health port's server: its own threads, small messages, short-lived connections."""
        server = grpc.server(
            ThreadPoolExecutor(max_workers=PROBE_THREADS, thread_name_prefix="skiff-health"),
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", PROBE_MAX_MESSAGE_BYTES),
                ("grpc.max_connection_age_ms", PROBE_CONNECTION_AGE_MS),
                ("grpc.max_connection_age_grace_ms", PROBE_CONNECTION_GRACE_MS),
            ],
            maximum_concurrent_rpcs=PROBE_THREADS,
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.probes, server)
        return server
