"""Handlers that read their one request message within a time limit, and streams capped in number.

gRPC reads a unary call's message before it calls the handler, so a call that sends headers and never its
message holds one of the server's concurrent-RPC places for as long as the client likes. Registered
client-streaming instead (the same bytes on the wire: headers, one message, end of stream; every unary client
works unchanged), a handler runs on the headers and reads the message itself, within `timeout_s`. Server-streaming
methods (health Watch) become bidirectional the same way and are capped at `max_streams` open at once.

Small methods (everything but inference itself) refuse a message over SMALL_REQUEST_BYTES before protobuf parses
it (`small`). gRPC has one receive limit per server, so such a message has been received by then; what is kept
from it is the parse (a repeated field of millions of empty strings would take gigabytes), and on a port with a
token the whole read (the token is checked on the headers, see auth.py).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from skiff_runtime.errors import DeadlineExceeded, InvalidInput
from skiff_runtime.server.interceptors import kind_of, rebuilt

# Requests of every method but inference name a model, a service or a symbol and a field or two; anything larger
# is refused before protobuf expands it.
SMALL_REQUEST_BYTES = 64 * 1024


class _Captured:
    """Stands in for a server to collect the method handlers that generated code registers."""

    def __init__(self) -> None:
        self.service = ""
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        for handler in handlers:  # older generated code registers only a generic handler
            self.service = self.service or handler.service_name()
            self.handlers = {**dict(getattr(handler, "_method_handlers", {})), **self.handlers}

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.service, self.handlers = service, dict(handlers)


def capture(add_to_server: Callable[[Any, Any], None], servicer: Any) -> tuple[str, dict[str, grpc.RpcMethodHandler]]:
    """The service name and method handlers that generated `add_XServicer_to_server` would register."""
    captured = _Captured()
    add_to_server(servicer, captured)
    return captured.service, captured.handlers


def add_handlers(server: grpc.aio.Server, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    server.add_registered_method_handlers(service, handlers)


async def read_message(context: grpc.aio.ServicerContext, timeout_s: float, what: str) -> Any:
    """The call's one request message, or DeadlineExceeded when it has not arrived within timeout_s."""
    try:
        async with asyncio.timeout(timeout_s):
            message = await context.read()
    except TimeoutError:
        raise DeadlineExceeded(f"the {what} message did not arrive within {timeout_s:g} s of its headers") from None
    if message is grpc.aio.EOF:
        raise InvalidInput(f"the call carried no {what} message")
    return message


def limited(parse: Callable[[bytes], Any] | None, method: str, max_bytes: int) -> Callable[[bytes], Any]:
    """A request deserializer that refuses (InvalidInput) a message over max_bytes before `parse` sees it."""

    def deserialize(data: bytes) -> Any:
        if len(data) > max_bytes:
            raise InvalidInput(f"a {method} request of {len(data)} bytes; it takes at most {max_bytes}")
        return parse(data) if parse is not None else data

    return deserialize


def small(
    handlers: dict[str, grpc.RpcMethodHandler], max_bytes: int = SMALL_REQUEST_BYTES
) -> dict[str, grpc.RpcMethodHandler]:
    """The same unary and server-streaming handlers, each refusing a request over max_bytes before parsing it
    (wrap with `bounded` afterwards: it reads the raw message and hands it to this deserializer)."""
    out: dict[str, grpc.RpcMethodHandler] = {}
    for method, handler in handlers.items():
        if kind_of(handler) not in ("unary_unary", "unary_stream"):
            raise TypeError(f"{method} reads a stream of messages; cap each with receive.limited instead")
        out[method] = rebuilt(handler, request_deserializer=limited(handler.request_deserializer, method, max_bytes))
    return out


def _unary(handler: grpc.RpcMethodHandler, method: str, timeout_s: float) -> grpc.RpcMethodHandler:
    inner, deserialize = handler.unary_unary, handler.request_deserializer

    async def behaviour(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> Any:
        message = await read_message(context, timeout_s, method)
        return await inner(deserialize(message) if deserialize else message, context)

    return grpc.stream_unary_rpc_method_handler(behaviour, response_serializer=handler.response_serializer)


class _Streams:
    """How many server-streaming calls are open; past the cap a new one is refused RESOURCE_EXHAUSTED."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.open = 0


def _streaming(
    handler: grpc.RpcMethodHandler, method: str, timeout_s: float, streams: _Streams
) -> grpc.RpcMethodHandler:
    inner, deserialize = handler.unary_stream, handler.request_deserializer

    async def behaviour(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
        if streams.open >= streams.cap:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{streams.cap} {method} streams are open, the most this server keeps; poll with Check instead",
            )
        streams.open += 1
        try:
            try:
                message = await read_message(context, timeout_s, method)
                request = deserialize(message) if deserialize else message
            except (DeadlineExceeded, InvalidInput) as exc:
                code = grpc.StatusCode.DEADLINE_EXCEEDED if isinstance(exc, DeadlineExceeded) else None
                await context.abort(code or grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            result = inner(request, context)
            if inspect.isasyncgen(result):
                async for response in result:
                    await context.write(response)
            else:
                await result
        finally:
            streams.open -= 1

    return grpc.stream_stream_rpc_method_handler(behaviour, response_serializer=handler.response_serializer)


def bounded(
    handlers: dict[str, grpc.RpcMethodHandler], timeout_s: float, max_streams: int
) -> dict[str, grpc.RpcMethodHandler]:
    """The same methods, each reading its request within timeout_s; server-streaming ones capped at max_streams
    open at once (together). Client-streaming handlers are left as they are (they read for themselves)."""
    streams = _Streams(max_streams)
    out: dict[str, grpc.RpcMethodHandler] = {}
    for method, handler in handlers.items():
        if handler.unary_unary is not None:
            out[method] = _unary(handler, method, timeout_s)
        elif handler.unary_stream is not None:
            out[method] = _streaming(handler, method, timeout_s, streams)
        else:
            out[method] = handler
    return out
