"""ModelInfer's admission before the message: pure adapter logic, driven with a stand-in gRPC context."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from skiff_runtime.errors import DeadlineExceeded, InvalidInput, QueueFull
from skiff_runtime.server.servicer import InferenceServicer


class Admissions:
    """A service stand-in that only admits: counts places held, refuses past `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def admit(self) -> Admissions:
        if self.held >= self.limit:
            raise QueueFull("queue full")
        self.held += 1
        return self

    def __enter__(self) -> Admissions:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.held -= 1


class Context:
    """read() returns `message` after `delay_s` (forever when None)."""

    def __init__(self, message: object = grpc.aio.EOF, delay_s: float | None = 0.0) -> None:
        self.message = message
        self.delay_s = delay_s
        self.reads = 0

    async def read(self) -> object:
        self.reads += 1
        if self.delay_s is None:
            await asyncio.Event().wait()
        await asyncio.sleep(self.delay_s or 0)
        return self.message

    def time_remaining(self) -> None:
        return None


async def test_a_full_queue_is_refused_without_reading_the_message() -> None:
    admissions = Admissions(limit=0)
    context = Context(delay_s=None)
    with pytest.raises(QueueFull):
        await InferenceServicer(admissions).ModelInfer(None, context)  # type: ignore[arg-type]
    assert context.reads == 0


async def test_a_message_that_never_arrives_gives_its_place_back() -> None:
    admissions = Admissions(limit=1)
    with pytest.raises(DeadlineExceeded, match=r"did not arrive within 0\.05 s"):
        await InferenceServicer(admissions, receive_timeout_s=0.05).ModelInfer(None, Context(delay_s=None))  # type: ignore[arg-type]
    assert admissions.held == 0


async def test_a_call_without_a_message_is_invalid_and_gives_its_place_back() -> None:
    admissions = Admissions(limit=1)
    with pytest.raises(InvalidInput, match="no ModelInferRequest"):
        await InferenceServicer(admissions).ModelInfer(None, Context(grpc.aio.EOF))  # type: ignore[arg-type]
    assert admissions.held == 0
