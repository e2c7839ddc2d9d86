"""The pieces every Skiff server interceptor shares: an interceptor of the handlers that answer once
(`UnaryInterceptor`), replacing the behaviour of such a handler, and a handler of any kind that refuses the call.

Handlers that answer with one message are unary (`unary_unary`) or, for ModelInfer, client-streaming
(`stream_unary`: the same bytes on the wire as unary, but the handler runs when the headers arrive, before the
request message is read). Interceptors wrap either kind the same way: `behaviour(request_or_iterator, context)`.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]]
UnaryBehaviour = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


def is_unary(handler: grpc.RpcMethodHandler | None) -> bool:
    """Whether the handler answers with one message (unary or client-streaming)."""
    return handler is not None and (handler.unary_unary is not None or handler.stream_unary is not None)


def behaviour_of(handler: grpc.RpcMethodHandler) -> UnaryBehaviour:
    behaviour = handler.unary_unary if handler.unary_unary is not None else handler.stream_unary
    if behaviour is None:
        raise TypeError("handler does not answer with one message")
    return behaviour  # type: ignore[no-any-return]


def with_unary(handler: grpc.RpcMethodHandler | None, behaviour: UnaryBehaviour) -> grpc.RpcMethodHandler:
    """A handler of the same kind running `behaviour`, keeping the original (de)serializers when there is one."""
    make = (
        grpc.stream_unary_rpc_method_handler
        if handler is not None and handler.stream_unary is not None
        else grpc.unary_unary_rpc_method_handler
    )
    return make(
        behaviour,
        request_deserializer=handler.request_deserializer if handler else None,
        response_serializer=handler.response_serializer if handler else None,
    )


class UnaryInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Wraps the behaviour of every handler that answers once (`wrap`); streams pass through untouched."""

    @abc.abstractmethod
    def wrap(self, inner: UnaryBehaviour, method: str) -> UnaryBehaviour:
        """The behaviour that runs in place of `inner`, the handler of `method`."""

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if not is_unary(handler):
            return handler
        return with_unary(handler, self.wrap(behaviour_of(handler), handler_call_details.method))


# The four kinds of gRPC method handler: the attribute holding a handler's behaviour, and the factory of its kind.
HANDLER_KINDS: dict[str, Callable[..., grpc.RpcMethodHandler]] = {
    "unary_unary": grpc.unary_unary_rpc_method_handler,
    "unary_stream": grpc.unary_stream_rpc_method_handler,
    "stream_unary": grpc.stream_unary_rpc_method_handler,
    "stream_stream": grpc.stream_stream_rpc_method_handler,
}


def kind_of(handler: grpc.RpcMethodHandler) -> str:
    """The handler's kind, a key of HANDLER_KINDS."""
    return next(kind for kind in HANDLER_KINDS if getattr(handler, kind) is not None)


def rebuilt(
    handler: grpc.RpcMethodHandler,
    behaviour: Callable[..., Any] | None = None,
    request_deserializer: Callable[[bytes], Any] | None = None,
) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler`, with `behaviour` and/or `request_deserializer` in place of its own."""
    kind = kind_of(handler)
    return HANDLER_KINDS[kind](
        behaviour or getattr(handler, kind),
        request_deserializer=request_deserializer or handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def refusing(handler: grpc.RpcMethodHandler | None, code: grpc.StatusCode, details: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` (unary when None) that ends the call with `code` and `details`. One
    that runs on the headers (client-streaming or bidirectional) refuses before the request message is read."""

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, details)

    if handler is not None and handler.stream_stream is not None:
        make = grpc.stream_stream_rpc_method_handler
    elif handler is not None and handler.unary_stream is not None:
        make = grpc.unary_stream_rpc_method_handler
    else:
        return with_unary(handler, refuse)
    return make(
        refuse, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )
