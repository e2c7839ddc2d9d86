"""Observes every unary RPC: its status code and time (metrics), and what is in flight (graceful drain).

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

QUIET_PERIOD_S = 0.25

ObserveRpc = Callable[[str, str, float], None]


class RpcObserver(UnaryInterceptor):
    """Counts unary RPCs in flight, remembers the last arrival, and reports (method, code, seconds)."""

    def __init__(self, observe: ObserveRpc | None = None) -> None:
        self.in_flight = 0
        self.last_arrival = 0.0
        self._observe = observe

    def wrap(self, inner: UnaryBehaviour, method: str) -> UnaryBehaviour:
        async def observed(request: Any, context: grpc.aio.ServicerContext) -> Any:
            loop = asyncio.get_running_loop()
            started = self.last_arrival = loop.time()
            self.in_flight += 1
            code = "OK"
            try:
                return await inner(request, context)
            except BaseException:
                code = _code_name(context)
                raise
            finally:
                self.in_flight -= 1
                if self._observe is not None:
                    self._observe(method, code, loop.time() - started)

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
