"""The model service with a fake engine: loading and warm-up, readiness, model identity, deadlines, the queue
bound, engine failures and output selection."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Mapping

import numpy as np
import pytest
from runtime.tests.fakes import SIGNATURE, FakeEngine, x_request

from skiff_runtime.errors import (
    DeadlineExceeded,
    InferenceFailed,
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    QueueFull,
)
from skiff_runtime.service import ModelService, ModelState
from skiff_runtime.settings import BatchingLimits
from skiff_runtime.tensors import Array, Datatype, InferRequest, ModelSignature, Tensor, TensorSpec
from skiff_runtime.workers.thread import ThreadWorker

LIMITS = BatchingLimits(max_batch_size=4, max_queue_size=2)
WARMUP_CALLS = 4  # every batch size the batcher can emit: 1..max_batch_size


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    fake = FakeEngine()
    yield fake
    fake.release()


@pytest.fixture
async def service(engine: FakeEngine) -> AsyncIterator[ModelService]:
    svc = ModelService("m", "1", ThreadWorker(lambda: engine), LIMITS)
    await svc.load()
    yield svc
    engine.release()
    await svc.close()


async def wait_entered(engine: FakeEngine) -> None:
    assert await asyncio.to_thread(engine.entered.wait, 2), "engine was never called"


async def test_load_warms_every_batch_size_the_batcher_can_emit(engine: FakeEngine) -> None:
    svc = ModelService("m", "1", ThreadWorker(lambda: engine), LIMITS)
    assert svc.state is ModelState.LOADING
    await svc.load()
    assert svc.ready
    assert [call["x"].shape for call in engine.calls] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert all(call["x"].dtype == np.float32 and not call["x"].any() for call in engine.calls)
    await svc.close()


async def test_warmup_fills_variable_dims_and_warms_once_when_max_batch_is_one() -> None:
    signature = ModelSignature(
        inputs=(TensorSpec("ids", Datatype.INT64, (-1, -1)), TensorSpec("fixed", Datatype.FP16, (3, -1))),
        outputs=(TensorSpec("y", Datatype.FP32, (-1,)),),
    )

    class Recorder(FakeEngine):
        def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
            self.calls.append(dict(inputs))
            return {"y": np.zeros(1, dtype=np.float32)}

    fake = Recorder(signature)
    svc = ModelService("m", "1", ThreadWorker(lambda: fake), BatchingLimits(max_batch_size=1))
    await svc.load()
    (call,) = fake.calls
    assert (call["ids"].shape, call["ids"].dtype) == ((1, 16), np.int64)
    assert (call["fixed"].shape, call["fixed"].dtype) == ((3, 16), np.float16)
    await svc.close()


async def test_engine_is_built_and_run_on_one_inference_thread(engine: FakeEngine) -> None:
    def build() -> FakeEngine:
        engine.threads.add(threading.current_thread().name)
        return engine

    svc = ModelService("m", "1", ThreadWorker(build), LIMITS)
    await svc.load()
    await svc.infer(x_request())
    assert len(engine.calls) == WARMUP_CALLS + 1
    (thread,) = engine.threads
    assert thread.startswith("infer")
    assert thread != threading.current_thread().name
    await svc.close()


async def test_failed_load_is_reported_and_not_ready() -> None:
    def broken() -> FakeEngine:
        raise OSError("no such file: inference.pdiparams")

    svc = ModelService("m", "1", ThreadWorker(broken), LIMITS)
    with pytest.raises(OSError, match=r"inference\.pdiparams"):
        await svc.load()
    assert svc.state is ModelState.FAILED
    assert svc.error == "no such file: inference.pdiparams"
    with pytest.raises(ModelNotReady, match="failed"):
        await svc.infer(x_request())
    svc.stop()
    assert svc.state is ModelState.FAILED
    await svc.close()


async def test_infer_before_load_is_model_not_ready(engine: FakeEngine) -> None:
    svc = ModelService("m", "1", ThreadWorker(lambda: engine), LIMITS)
    with pytest.raises(ModelNotReady, match="'m' is loading"):
        await svc.infer(x_request())
    with pytest.raises(ModelNotReady):
        _ = svc.signature
    assert svc.platform == "unknown"
    assert engine.calls == []
    await svc.close()


async def test_ready_service_reports_its_engine(service: ModelService) -> None:
    assert service.signature is SIGNATURE
    assert service.platform == "fake"


@pytest.mark.parametrize(
    ("name", "version", "fragment"),
    [("other", "", "unknown model 'other'"), ("other", "1", "unknown model 'other'"), ("m", "2", "no version '2'")],
)
async def test_wrong_model_or_version_is_not_found(
    engine: FakeEngine, service: ModelService, name: str, version: str, fragment: str
) -> None:
    with pytest.raises(ModelNotFound, match=fragment):
        await service.infer(x_request(name=name, version=version))
    assert len(engine.calls) == WARMUP_CALLS


@pytest.mark.parametrize("version", ["", "1"])
async def test_empty_or_served_version_is_accepted(service: ModelService, version: str) -> None:
    response = await service.infer(x_request(version=version))
    assert (response.model_name, response.model_version, response.id) == ("m", "1", "req-1")


async def test_response_holds_every_output_in_signature_order(service: ModelService) -> None:
    response = await service.infer(x_request(batch=3))
    assert [(t.name, t.datatype) for t in response.outputs] == [
        ("out", Datatype.FP32),
        ("total", Datatype.FP64),
        ("rows", Datatype.INT64),
    ]
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(response.outputs[0].data, x * 2)
    np.testing.assert_array_equal(response.outputs[1].data, x.sum(axis=1))
    assert response.outputs[2].data.tolist() == [0, 1, 2]


async def test_requested_outputs_are_filtered_and_ordered(service: ModelService) -> None:
    response = await service.infer(x_request(outputs=("rows", "out")))
    assert [t.name for t in response.outputs] == ["rows", "out"]


async def test_invalid_request_is_rejected_before_the_engine(engine: FakeEngine, service: ModelService) -> None:
    with pytest.raises(InvalidInput, match=r"batch size 5 is outside 1\.\.4"):
        await service.infer(x_request(batch=5))
    with pytest.raises(InvalidInput, match="unknown requested output 'nope'"):
        await service.infer(x_request(outputs=("nope",)))
    assert len(engine.calls) == WARMUP_CALLS


async def test_expired_deadline_is_not_run(engine: FakeEngine, service: ModelService) -> None:
    with pytest.raises(DeadlineExceeded, match="not run"):
        await service.infer(x_request(), deadline=time.monotonic() - 0.001)
    assert len(engine.calls) == WARMUP_CALLS


async def test_deadline_expiring_while_queued_is_not_run(engine: FakeEngine, service: ModelService) -> None:
    gate = engine.block()
    first = asyncio.create_task(service.infer(x_request(batch=1)))
    await wait_entered(engine)
    second = asyncio.create_task(service.infer(x_request(batch=2), deadline=time.monotonic() + 0.05))
    await asyncio.sleep(0.1)
    assert not second.done()
    gate.set()
    assert [t.name for t in (await first).outputs] == ["out", "total", "rows"]
    with pytest.raises(DeadlineExceeded, match="in the queue; not run"):
        await second
    assert [call["x"].shape for call in engine.calls[WARMUP_CALLS:]] == [(1, 4)]


async def test_future_deadline_runs(engine: FakeEngine, service: ModelService) -> None:
    await service.infer(x_request(), deadline=time.monotonic() + 30)
    assert len(engine.calls) == WARMUP_CALLS + 1


async def test_full_queue_is_rejected_immediately(engine: FakeEngine, service: ModelService) -> None:
    gate = engine.block()
    running = asyncio.create_task(service.infer(x_request(batch=1)))
    await wait_entered(engine)
    queued = [asyncio.create_task(service.infer(x_request(batch=b))) for b in (2, 1)]
    await asyncio.sleep(0)
    assert service.queue_depth == 2
    started = time.monotonic()
    with pytest.raises(QueueFull, match=r"queue full \(2 requests waiting"):
        await service.infer(x_request(batch=3))
    assert time.monotonic() - started < 0.5
    gate.set()
    await asyncio.gather(running, *queued)
    # The two queued requests ran as one merged batch of 3 rows once the engine was free.
    assert [call["x"].shape[0] for call in engine.calls[WARMUP_CALLS:]] == [1, 3]
    await service.infer(x_request(batch=3))


async def test_engine_failure_is_inference_failed_and_the_next_request_works(
    engine: FakeEngine, service: ModelService
) -> None:
    engine.error = RuntimeError("CUDA error: out of memory")
    with pytest.raises(InferenceFailed, match="RuntimeError: CUDA error: out of memory"):
        await service.infer(x_request())
    response = await service.infer(x_request())
    assert len(response.outputs) == 3
    assert service.ready


async def test_domain_errors_from_the_engine_pass_through(engine: FakeEngine, service: ModelService) -> None:
    engine.error = InvalidInput("input 'x': values must be finite")
    with pytest.raises(InvalidInput, match="must be finite"):
        await service.infer(x_request())


async def test_engine_missing_an_output_is_inference_failed(engine: FakeEngine, service: ModelService) -> None:
    engine.drop_output = "total"
    with pytest.raises(InferenceFailed, match=r"no output\(s\) \['total'\]"):
        await service.infer(x_request(outputs=("out",)))


async def test_stopped_service_is_not_ready(engine: FakeEngine, service: ModelService) -> None:
    service.stop()
    assert service.state is ModelState.STOPPING
    assert not service.ready
    with pytest.raises(ModelNotReady, match="stopping"):
        await service.infer(x_request())
    assert len(engine.calls) == WARMUP_CALLS


async def test_admission_counts_arriving_requests_against_the_queue(engine: FakeEngine, service: ModelService) -> None:
    """A request admitted when its headers arrive holds a queue place until its message reaches the queue."""
    first, second = service.admit(), service.admit()
    assert service.arriving == 2
    with pytest.raises(QueueFull, match=r"queue full \(2 requests waiting or arriving"):
        service.admit()
    first.release()
    first.release()  # released at most once
    assert service.arriving == 1
    third = service.admit()
    with pytest.raises(QueueFull):
        service.admit()
    second.release()
    third.release()
    assert service.arriving == 0


async def test_an_admitted_request_hands_its_place_to_the_queue(engine: FakeEngine, service: ModelService) -> None:
    gate = engine.block()
    running = asyncio.create_task(service.infer(x_request(batch=1)))
    await wait_entered(engine)
    admission = service.admit()
    queued = asyncio.create_task(service.infer(x_request(batch=1), admission=admission))
    await asyncio.sleep(0)
    assert (service.arriving, service.queue_depth) == (0, 1)
    service.admit().release()  # one place left of two
    with pytest.raises(QueueFull), service.admit():
        service.admit()
    gate.set()
    await asyncio.gather(running, queued)
    assert (service.arriving, service.queue_depth) == (0, 0)


async def test_a_failed_admitted_request_gives_its_place_back(engine: FakeEngine, service: ModelService) -> None:
    admission = service.admit()
    with pytest.raises(ModelNotFound):
        await service.infer(x_request(name="other"), admission=admission)
    assert service.arriving == 0


async def test_admission_needs_a_ready_model(engine: FakeEngine) -> None:
    svc = ModelService("m", "1", ThreadWorker(lambda: engine), LIMITS)
    with pytest.raises(ModelNotReady):
        svc.admit()


async def test_request_bytes_are_held_against_the_budget_until_answered(engine: FakeEngine) -> None:
    svc = ModelService("m", "1", ThreadWorker(lambda: engine), BatchingLimits(max_batch_size=4), max_request_bytes=100)
    await svc.load()
    with svc.budget.hold(60):
        assert svc.budget.held == 60
        with pytest.raises(QueueFull, match="41 more bytes do not fit"), svc.budget.hold(41):
            pass
        with svc.budget.hold(40), pytest.raises(QueueFull, match="budget full"):  # spent: refused on the headers
            svc.admit()
    assert svc.budget.held == 0
    with pytest.raises(QueueFull, match="larger than the whole budget"), svc.budget.hold(101):
        pass
    with svc.admit():  # room again
        pass
    await svc.close()


class GroupedFake:
    """A grouped engine (a task's shape) in process: records each group's BYTES lengths; b"bad" is refused alone."""

    platform = "fake_task"
    signature = ModelSignature(
        inputs=(TensorSpec("image", Datatype.BYTES, (-1,)),),
        outputs=(TensorSpec("texts", Datatype.BYTES, (-1,)),),
        grouped=True,
    )

    def __init__(self) -> None:
        self.groups: list[list[int]] = []
        self.started = threading.Event()
        self.go = threading.Event()

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        raise AssertionError("a grouped model is run by groups")

    def run_group(self, requests):  # type: ignore[no-untyped-def]
        self.started.set()
        self.go.wait(5)
        self.groups.append([len(r["image"]) for r in requests])
        return [
            InvalidInput("bad image") if b"bad" in list(r["image"]) else {"texts": np.array([b"line"] * 3, object)}
            for r in requests
        ]


def image_request(*items: bytes) -> InferRequest:
    return InferRequest("m", "", "", (Tensor("image", Datatype.BYTES, np.array(list(items), dtype=object)),))


async def test_a_grouped_model_warms_nothing_and_groups_concurrent_requests_answering_each_alone() -> None:
    fake = GroupedFake()
    svc = ModelService("m", "1", ThreadWorker(lambda: fake), BatchingLimits(max_batch_size=8, max_queue_size=8))
    await svc.load()
    assert svc.model_config().max_batch_size == 0  # rows out are lines, not images: no batch dimension to strip
    first = asyncio.ensure_future(svc.infer(image_request(b"a")))
    await asyncio.to_thread(fake.started.wait, 2)  # the first runs alone; the next three queue behind it
    rest = [asyncio.ensure_future(svc.infer(image_request(*items))) for items in ([b"b", b"c"], [b"bad"], [b"d"])]
    await asyncio.sleep(0.05)
    fake.go.set()
    answers = await asyncio.gather(first, *rest, return_exceptions=True)
    assert fake.groups == [[1], [2, 1, 1]]  # no warm-up call; one group of three, unmerged
    assert [a.outputs[0].data.tolist() for a in answers if not isinstance(a, BaseException)] == [[b"line"] * 3] * 3
    assert isinstance(answers[2], InvalidInput)
    await svc.close()
