"""Observes every unary RPC: its status code, time and message sizes (metrics), and what is in flight (graceful
drain).

On SIGTERM the gRPC server stops at once (GOAWAY on every connection) and the unary calls already sent run to
the end; once nothing is in flight and no call has reached a handler for a quiet period (bounded by the grace
period) the drain cuts what is left: streams such as health Watch, which never end by themselves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc

from skiff_runtime.server.interceptors import UnaryBehaviour, UnaryInterceptor
from skiff_runtime.server.shadow import is_shadow_copy

QUIET_PERIOD_S = 0.25

# (method, code, seconds, request bytes or None, response bytes or None)
ObserveRpc = Callable[[str, str, float, int | None, int | None], None]
# (code) of a call marked as a shadow copy (skiff-shadow: 1): counted apart, never in ObserveRpc's metrics.
ObserveShadow = Callable[[str], None]


def message_size(message: object) -> int | None:
    """Bytes of a message as read or sent: raw bytes, or a protobuf message; None for anything else (no message)."""
    if isinstance(message, bytes | bytearray | memoryview):
        return len(message)
    byte_size = getattr(message, "ByteSize", None)
    return int(byte_size()) if callable(byte_size) else None


class _Reading:
    """The handler's context, remembering the size of the message it reads (handlers read with context.read())."""

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._context = context
        self.received: int | None = None

    async def read(self) -> Any:
        message = await self._context.read()
        size = message_size(message)
        if size is not None:
            self.received = (self.received or 0) + size
        return message

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


class RpcObserver(UnaryInterceptor):
    """Counts unary RPCs in flight, remembers the last arrival, and reports (method, code, seconds, request bytes,
    response bytes); a call marked as a shadow copy is reported to `observe_shadow` alone (its code), so the
    rollout analysis, which reads ObserveRpc's metrics, never counts a copy as the candidate's user traffic."""

    def __init__(self, observe: ObserveRpc | None = None, observe_shadow: ObserveShadow | None = None) -> None:
        self.in_flight = 0
        self.last_arrival = 0.0
        self._observe = observe
        self._observe_shadow = observe_shadow

    def wrap(self, inner: UnaryBehaviour, method: str) -> UnaryBehaviour:
        async def observed(request: Any, context: grpc.aio.ServicerContext) -> Any:
            loop = asyncio.get_running_loop()
            started = self.last_arrival = loop.time()
            self.in_flight += 1
            code = "OK"
            reading = _Reading(context)
            sent: int | None = None
            try:
                response = await inner(request, reading)
                sent = message_size(response)
                return response
            except BaseException:
                code = _code_name(context)
                raise
            finally:
                self.in_flight -= 1
                if is_shadow_copy(context.invocation_metadata()):
                    if self._observe_shadow is not None:
                        self._observe_shadow(code)
                elif self._observe is not None:
                    received = reading.received if reading.received is not None else message_size(request)
                    self._observe(method, code, loop.time() - started, received, sent)

        return observed

    async def wait_idle(self, timeout_s: float, quiet_s: float = QUIET_PERIOD_S) -> bool:
        """True once nothing is in flight and nothing arrived for quiet_s; False if timeout_s passed first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            if self.in_flight == 0 and loop.time() - self.last_arrival >= quiet_s:
                return True
            await asyncio.sleep(0.02)
        return False


def _code_name(context: grpc.aio.ServicerContext) -> str:
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return str(code.name)
    return "UNKNOWN"
