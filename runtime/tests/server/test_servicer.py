"""ModelInfer: admission before the message, and the OIP request decoded at the edge against the model's contract;
driven with a stand-in gRPC context."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from runtime.tests.fakes import FakeContext, FakeEngine

from skiff_runtime.codec import decode_response
from skiff_runtime.errors import DeadlineExceeded, InvalidInput, ModelNotFound, QueueFull
from skiff_runtime.proto import inference_pb2 as pb
from skiff_runtime.server.servicer import InferenceServicer
from skiff_runtime.service import ModelService
from skiff_runtime.settings import BatchingLimits
from skiff_runtime.workers.thread import ThreadWorker


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


async def test_a_full_queue_is_refused_without_reading_the_message() -> None:
    admissions = Admissions(limit=0)
    context = FakeContext(delay_s=None)
    with pytest.raises(QueueFull):
        await InferenceServicer(admissions).ModelInfer(None, context)  # type: ignore[arg-type]
    assert context.reads == 0


async def test_a_message_that_never_arrives_gives_its_place_back() -> None:
    admissions = Admissions(limit=1)
    with pytest.raises(DeadlineExceeded, match=r"did not arrive within 0\.05 s"):
        await InferenceServicer(admissions, receive_timeout_s=0.05).ModelInfer(None, FakeContext(delay_s=None))  # type: ignore[arg-type]
    assert admissions.held == 0


async def test_a_call_without_a_message_is_invalid_and_gives_its_place_back() -> None:
    admissions = Admissions(limit=1)
    with pytest.raises(InvalidInput, match="no ModelInferRequest"):
        await InferenceServicer(admissions).ModelInfer(None, FakeContext(grpc.aio.EOF))  # type: ignore[arg-type]
    assert admissions.held == 0


@pytest.fixture
async def service() -> AsyncIterator[ModelService]:
    engine = FakeEngine()
    svc = ModelService("m", "1", ThreadWorker(lambda: engine), BatchingLimits(max_batch_size=4))
    await svc.load()
    yield svc
    await svc.close()


def _x_message(rows: int, values: int, model: str = "m") -> bytes:
    message = pb.ModelInferRequest(model_name=model, id="r-1")
    contents = pb.InferTensorContents(fp32_contents=[1.0] * values)
    message.inputs.add(name="x", datatype="FP32", shape=[rows, 4], contents=contents)
    return message.SerializeToString()


async def test_model_infer_decodes_at_the_edge_and_answers_the_served_model(service: ModelService) -> None:
    reply = await InferenceServicer(service).ModelInfer(None, FakeContext(_x_message(2, 8)))  # type: ignore[arg-type]
    message = pb.ModelInferResponse.FromString(reply)
    assert (message.model_name, message.model_version, message.id) == ("m", "1", "r-1")
    assert decode_response(message)["out"].tolist() == [[2.0] * 4] * 2
    assert (service.budget.held, service.arriving) == (0, 0)


async def test_model_infer_checks_the_contract_before_the_data(service: ModelService) -> None:
    servicer = InferenceServicer(service)
    # 1 value for 20 elements: refused on its head (batch 5 > 4), its data never looked at.
    with pytest.raises(InvalidInput, match=r"batch size 5 is outside 1\.\.4"):
        await servicer.ModelInfer(None, FakeContext(_x_message(5, 1)))  # type: ignore[arg-type]
    with pytest.raises(ModelNotFound, match="unknown model 'other'"):
        await servicer.ModelInfer(None, FakeContext(_x_message(2, 8, model="other")))  # type: ignore[arg-type]
    assert (service.budget.held, service.arriving) == (0, 0)
