"""Tracks unary RPCs so shutdown can wait until accepted requests are answered and arrivals have stopped.

gRPC cancels calls it has received but not yet handed to a handler when the server stops; so on SIGTERM the
runtime first refuses new work with UNAVAILABLE, then waits until nothing is in flight and no RPC has arrived
for a quiet period (bounded by the grace period), and only then stops the gRPC server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

QUIET_PERIOD_S = 0.25


class RpcTracker(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Counts unary RPCs in flight and remembers when the last one arrived (on the event loop's clock)."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.last_arrival = 0.0

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        inner = handler.unary_unary

        async def tracked(request: Any, context: grpc.aio.ServicerContext) -> Any:
            self.in_flight += 1
            self.last_arrival = asyncio.get_running_loop().time()
            try:
                return await inner(request, context)
            finally:
                self.in_flight -= 1

        return grpc.unary_unary_rpc_method_handler(
            tracked,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    async def wait_idle(self, timeout_s: float, quiet_s: float = QUIET_PERIOD_S) -> bool:
        """True once nothing is in flight and nothing arrived for quiet_s; False if timeout_s passed first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            if self.in_flight == 0 and loop.time() - self.last_arrival >= quiet_s:
                return True
            await asyncio.sleep(0.02)
        return False
