"""Handlers that read their one request message within a time limit, and streams capped in number.

gRPC reads a unary call's message before it calls the handler, so a call that sends headers and never its
message holds one of the server's concurrent-RPC places for as long as the client likes. Registered
client-streaming instead (the same bytes on the wire: headers, one message, end of stream; every unary client
works unchanged), a handler runs on the headers and reads the message itself, within `timeout_s`. Server-streaming
methods (health Watch) become bidirectional the same way and are capped at `max_streams` open at once.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from skiff_runtime.errors import DeadlineExceeded, InvalidInput


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
            except (DeadlineExceeded, InvalidInput) as exc:
                code = grpc.StatusCode.DEADLINE_EXCEEDED if isinstance(exc, DeadlineExceeded) else None
                await context.abort(code or grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            result = inner(deserialize(message) if deserialize else message, context)
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
