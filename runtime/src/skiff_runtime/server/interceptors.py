"""The one piece every Skiff server interceptor shares: replacing the behaviour of a handler that answers once.

Handlers that answer with one message are unary (`unary_unary`) or, for ModelInfer, client-streaming
(`stream_unary`: the same bytes on the wire as unary, but the handler runs when the headers arrive, before the
request message is read). Interceptors wrap either kind the same way: `behaviour(request_or_iterator, context)`.
"""

from __future__ import annotations

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
