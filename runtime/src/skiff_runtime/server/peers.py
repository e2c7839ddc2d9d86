"""A cap on the calls one client address has open at once, so that no client can fill a server for the others.

The cap counts per source IP (not per connection, which costs a client nothing to multiply) and is checked when a
call's headers arrive, before its message is read: it wraps handlers that run on the headers (client-streaming
and bidirectional, as `receive.bounded` makes every method). A refused call is answered RESOURCE_EXHAUSTED at
once; the client's place comes back when one of its calls ends, however it ends.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from skiff_runtime.server.interceptors import Continuation, kind_of, rebuilt


def peer_address(peer: str) -> str:
    """The client's IP address in gRPC's peer string ("ipv4:10.1.2.3:5000", "ipv6:[::1]:5000", "ipv6:%5B::1%5D:5000"),
    an IPv4-mapped IPv6 address as its IPv4 one; a peer with no IP (a Unix socket) is its whole string."""
    scheme, _, rest = peer.partition(":")
    if scheme not in ("ipv4", "ipv6"):
        return peer
    host = rest.replace("%5B", "[").replace("%5D", "]")
    host = host[1 : host.index("]")] if host.startswith("[") else host.rsplit(":", 1)[0]
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return peer
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


class PeerCalls:
    """How many calls each address has open; `enter` says whether one more is within the cap."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.open: Counter[str] = Counter()

    def enter(self, address: str) -> bool:
        if self.open[address] >= self.cap:
            return False
        self.open[address] += 1
        return True

    def leave(self, address: str) -> None:
        self.open[address] -= 1
        if self.open[address] <= 0:
            del self.open[address]  # the table holds only addresses with calls open


Behaviour = Callable[[AsyncIterator[Any], grpc.aio.ServicerContext], Awaitable[Any]]


def _capped(behaviour: Behaviour, calls: PeerCalls) -> Behaviour:
    async def capped(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        address = peer_address(context.peer())
        if not calls.enter(address):
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{calls.cap} calls from {address} are open, the most this port keeps per client address; "
                "send each call's message at once or wait for the open ones to end",
            )
        try:
            return await behaviour(requests, context)
        finally:
            calls.leave(address)

    return capped


class PeerCap(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Every method of a server under one cap of `cap` calls open per client address (the inference port). Its
    methods run on the headers (receive.bounded), so a refused call is answered before its message is read."""

    def __init__(self, cap: int) -> None:
        self.calls = PeerCalls(cap)

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        return rebuilt(handler, _capped(getattr(handler, kind_of(handler)), self.calls))


def per_peer(handlers: dict[str, grpc.RpcMethodHandler], cap: int) -> dict[str, grpc.RpcMethodHandler]:
    """The same methods, sharing one cap of `cap` calls open per client address. Every handler must run on the
    headers (client-streaming or bidirectional): a unary one is read before it runs, so a cap there comes too late."""
    calls = PeerCalls(cap)
    out: dict[str, grpc.RpcMethodHandler] = {}
    for method, handler in handlers.items():
        kind = kind_of(handler)
        if kind not in ("stream_unary", "stream_stream"):
            raise TypeError(f"{method} reads its message before it runs; wrap it with receive.bounded first")
        out[method] = rebuilt(handler, _capped(getattr(handler, kind), calls))
    return out
