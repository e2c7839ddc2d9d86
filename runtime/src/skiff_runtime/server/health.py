"""grpc.health.v1 for the model: "" and the model's name follow the model's readiness."""

from __future__ import annotations

from grpc_health.v1 import health, health_pb2

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class ModelHealth:
    """One health servicer shared by the inference port and the plaintext health port."""

    def __init__(self, model_name: str) -> None:
        self.servicer = health.aio.HealthServicer()
        self.services = ("", model_name)

    async def set_serving(self, serving: bool) -> None:
        for service in self.services:
            await self.servicer.set(service, SERVING if serving else NOT_SERVING)

    async def shut_down(self) -> None:
        """NOT_SERVING for every service, for good: later set() calls are ignored."""
        await self.servicer.enter_graceful_shutdown()
