"""The runtime process: inference + health on the gRPC port, health alone on the plaintext health port.

Lifecycle: ports open at once with health NOT_SERVING; the model loads and warms; health turns SERVING.
SIGTERM/SIGINT: health NOT_SERVING, new RPCs refused, in-flight RPCs finish within the grace period, exit 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2_grpc

from skiff_runtime.proto import inference_pb2_grpc as pb_grpc
from skiff_runtime.server.health import ModelHealth
from skiff_runtime.server.servicer import InferenceServicer
from skiff_runtime.server.status_codes import ErrorInterceptor
from skiff_runtime.service import Engine, ModelService, ServiceLimits
from skiff_runtime.settings import RuntimeSettings

log = logging.getLogger(__name__)


def _channel_options(settings: RuntimeSettings) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", settings.max_message_bytes),
        ("grpc.max_send_message_length", settings.max_message_bytes),
        ("grpc.so_reuseport", 0),
    ]


class RuntimeServer:
    """Owns the two gRPC servers, the model service and the health state."""

    def __init__(self, settings: RuntimeSettings, engine_factory: Callable[[], Engine]) -> None:
        self.settings = settings
        self.service = ModelService(
            settings.model_name,
            settings.model_version,
            engine_factory,
            ServiceLimits(settings.max_batch_size, settings.max_queue_size),
        )
        self.health = ModelHealth(settings.model_name)
        self.grpc_server = grpc.aio.server(interceptors=[ErrorInterceptor()], options=_channel_options(settings))
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(self.service), self.grpc_server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health.servicer, self.grpc_server)
        self.health_server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        health_pb2_grpc.add_HealthServicer_to_server(self.health.servicer, self.health_server)
        self.grpc_port = 0
        self.health_port = 0
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        await self.health.set_serving(False)
        host = self.settings.host
        self.grpc_port = self.grpc_server.add_insecure_port(f"{host}:{self.settings.grpc_port}")
        self.health_port = self.health_server.add_insecure_port(f"{host}:{self.settings.health_port}")
        await self.health_server.start()
        await self.grpc_server.start()
        log.info(
            "listening",
            extra={
                "grpc_port": self.grpc_port,
                "health_port": self.health_port,
                "model": self.settings.model_name,
            },
        )

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)

    async def load_model(self) -> None:
        try:
            await self.service.load()
        except Exception:
            log.exception("model failed to load; health stays NOT_SERVING", extra={"model": self.service.name})
            return
        finally:
            # Paddle installs its own SIGTERM handler when it is first imported (on the inference thread):
            # take SIGTERM back so shutdown stays graceful.
            self.install_signal_handlers()
        await self.health.set_serving(True)

    def request_stop(self) -> None:
        self._stopping.set()

    async def stop(self) -> None:
        """Health NOT_SERVING, refuse new RPCs, let in-flight ones finish within the grace period."""
        log.info("shutting down", extra={"grace_period_s": self.settings.grace_period_s})
        await self.health.shut_down()
        self.service.stop()
        await self.grpc_server.stop(self.settings.grace_period_s)
        await self.health_server.stop(0)
        await asyncio.get_running_loop().run_in_executor(None, self.service.close)
        log.info("stopped")

    async def serve(self) -> None:
        """Run until SIGTERM or SIGINT (construct the server inside the running event loop)."""
        self.install_signal_handlers()
        await self.start()
        loader = asyncio.create_task(self.load_model())
        await self._stopping.wait()
        loader.cancel()
        await self.stop()


async def run_server(settings: RuntimeSettings, engine_factory: Callable[[], Engine]) -> None:
    """Build the server inside the running loop (grpc.aio binds to it) and serve until a stop signal."""
    await RuntimeServer(settings, engine_factory).serve()
