"""The one piece every Skiff server interceptor shares: replacing a unary handler's behaviour."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]]
UnaryBehaviour = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


def is_unary(handler: grpc.RpcMethodHandler | None) -> bool:
    return handler is not None and handler.unary_unary is not None


def with_unary(handler: grpc.RpcMethodHandler | None, behaviour: UnaryBehaviour) -> grpc.RpcMethodHandler:
    """A unary handler running `behaviour`, keeping the original (de)serializers when there is one."""
    return grpc.unary_unary_rpc_method_handler(
        behaviour,
        request_deserializer=handler.request_deserializer if handler else None,
        response_serializer=handler.response_serializer if handler else None,
    )
