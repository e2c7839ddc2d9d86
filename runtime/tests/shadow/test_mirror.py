"""The mirror never slows or fails the user's request: with the candidate stuck, failing or answering, every user
request through a real gRPC server is answered at once; copies beyond the queue are dropped and counted; the
candidate (a real gRPC server) gets copies marked as shadow traffic and its answers are compared and counted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

import grpc
import numpy as np
import pytest

from skiff_runtime.codec import decode_request, decode_response, encode_request, encode_response
from skiff_runtime.proto import inference_pb2 as pb
from skiff_runtime.proto import inference_pb2_grpc
from skiff_runtime.shadow.compare import CompareMode, OutputRule, Rules
from skiff_runtime.shadow.mirror import Mirror
from skiff_runtime.tensors import Array, Datatype, InferResponse, Tensor

SHADOW_HEADER = "skiff-shadow"  # the marker the candidate's metrics separate copies by


def scores(x: Array) -> Array:
    return (x * 2).astype(np.float32)


@dataclass
class Candidate(inference_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """A candidate version: answers like the stable one (`offset` 0), differently, fails or never answers."""

    behaviour: str = "same"
    offset: float = 0.0
    marked: list[str] = field(default_factory=list)

    async def ModelInfer(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext) -> object:
        self.marked.append(dict(context.invocation_metadata()).get(SHADOW_HEADER, ""))
        if self.behaviour == "stuck":
            await asyncio.sleep(3600)
        if self.behaviour == "fail":
            await context.abort(grpc.StatusCode.INTERNAL, "candidate broke")
        x = decode_request(request).inputs[0].data
        out = Tensor("scores", Datatype.FP32, scores(x) + np.float32(self.offset))
        return encode_response(InferResponse("m", "v2", request.id, (out,)))


@dataclass
class Stable(inference_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """The stable version: answers, then offers the copy to the mirror (the user's path)."""

    mirror: Mirror | None = None

    async def ModelInfer(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext) -> object:
        x = decode_request(request).inputs[0].data
        outputs = {"scores": scores(x)}
        if self.mirror is not None:
            self.mirror.offer({"x": x}, outputs)
        out = Tensor("scores", Datatype.FP32, outputs["scores"])
        return encode_response(InferResponse("m", "v1", request.id, (out,)))


async def serve(servicer: object) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    inference_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


@dataclass
class Stage:
    candidate: Candidate
    mirror: Mirror
    stable_target: str


@pytest.fixture
async def stage(request: pytest.FixtureRequest) -> AsyncIterator[Stage]:
    behaviour, offset, queue_size = request.param
    candidate = Candidate(behaviour, offset)
    candidate_server, candidate_target = await serve(candidate)
    channel = grpc.aio.insecure_channel(candidate_target)
    stub = inference_pb2_grpc.GRPCInferenceServiceStub(channel)

    async def send(inputs: Mapping[str, Array]) -> Mapping[str, Array]:
        tensors = [Tensor(name, Datatype.FP32, array) for name, array in inputs.items()]
        reply = await stub.ModelInfer(encode_request("m", tensors), metadata=[(SHADOW_HEADER, "1")])
        return decode_response(reply)

    mirror = Mirror(send, Rules(OutputRule(CompareMode.TOLERANCE, atol=1e-6, rtol=0)), ratio=0.5,
                    queue_size=queue_size, timeout_s=0.5)  # fmt: skip
    stable_server, stable_target = await serve(Stable(mirror))
    worker = asyncio.create_task(mirror.run())
    try:
        yield Stage(candidate, mirror, stable_target)
    finally:
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
        await channel.close()
        await stable_server.stop(0)
        await candidate_server.stop(0)


async def user_requests(target: str, count: int) -> list[float]:
    """`count` requests of a user on one connection to the stable version; the seconds each took."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = inference_pb2_grpc.GRPCInferenceServiceStub(channel)
        took = []
        for i in range(count):
            x = np.full((1, 4), i, np.float32)
            started = time.perf_counter()
            reply = await stub.ModelInfer(encode_request("m", [Tensor("x", Datatype.FP32, x)]), timeout=5)
            took.append(time.perf_counter() - started)
            assert decode_response(reply)["scores"].tolist() == scores(x).tolist()  # the stable answer, always
        return took


@pytest.mark.parametrize("stage", [("stuck", 0.0, 4)], indirect=True)
async def test_a_stuck_candidate_costs_the_user_nothing_and_the_copies_past_the_queue_are_dropped(stage: Stage) -> None:
    took = await user_requests(stage.stable_target, 200)
    tally = stage.mirror.tally
    print(f"stuck candidate: user p50 {sorted(took)[100] * 1e3:.2f} ms, max {max(took) * 1e3:.2f} ms; {tally}")
    assert max(took) < 1.0  # every request answered at once (the candidate never answers)
    assert (tally.offered, tally.sampled) == (200, 100)  # ratio 0.5: every second request
    assert stage.mirror.queue.qsize() <= 4
    # One copy at a time is with the candidate (until its 0.5 s timeout), four wait, the rest were dropped.
    assert tally.dropped >= 100 - 4 - 1 - len(stage.candidate.marked), tally
    assert tally.dropped + tally.failed + stage.mirror.queue.qsize() + 1 >= 100, tally
    assert tally.compared == 0


@pytest.mark.parametrize("stage", [("fail", 0.0, 64)], indirect=True)
async def test_a_failing_candidate_is_counted_and_never_fails_the_user(stage: Stage) -> None:
    await user_requests(stage.stable_target, 40)
    await asyncio.wait_for(stage.mirror.queue.join(), 10)
    tally = stage.mirror.tally
    assert (tally.sampled, tally.dropped, tally.failed, tally.compared) == (20, 0, 20, 0), tally


@pytest.mark.parametrize(("stage", "agreed"), [(("same", 0.0, 64), True), (("other", 0.5, 64), False)],
                         indirect=["stage"])  # fmt: skip
async def test_copies_reach_the_candidate_marked_and_are_compared(stage: Stage, agreed: bool) -> None:
    await user_requests(stage.stable_target, 40)
    await asyncio.wait_for(stage.mirror.queue.join(), 10)
    tally = stage.mirror.tally
    assert stage.candidate.marked == ["1"] * 20  # every copy carries the shadow marker
    assert (tally.agreed, tally.disagreed) == ((20, 0) if agreed else (0, 20)), tally
    if not agreed:
        assert stage.mirror.last_difference.startswith("scores: max |diff| 0.5"), stage.mirror.last_difference


def test_a_mirror_refuses_a_ratio_or_queue_it_cannot_run() -> None:
    async def send(inputs: Mapping[str, Array]) -> Mapping[str, Array]:
        return inputs

    for ratio, size in ((0.0, 4), (1.5, 4), (0.5, 0)):
        with pytest.raises(ValueError, match="ratio must be in"):
            Mirror(send, Rules(), ratio=ratio, queue_size=size)
