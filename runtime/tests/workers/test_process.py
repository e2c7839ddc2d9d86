"""The process pool with a picklable fake engine (no Paddle): start and load failure, dispatch through shared memory,
back-pressure onto the free workers, a worker's crash (retried once, replaced), an engine error, a hung batch, and
shutdown."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import numpy as np
import pytest
from runtime.tests.fakes import (
    CANNOT_LOAD,
    CRASH,
    CRASH_ONCE,
    FAIL,
    GROUP_SIGNATURE,
    HANG,
    SIGNATURE,
    SLOW,
    fake_engine,
    fake_group_engine,
    fake_outputs,
)

from skiff_runtime.errors import InferenceFailed, InvalidInput, ModelLoadError, WorkerLost
from skiff_runtime.settings import RuntimeSettings
from skiff_runtime.tensors import Array
from skiff_runtime.workers.base import WorkerEvent
from skiff_runtime.workers.process import EngineFactory, ProcessPool

BUFFER_BYTES = 1 << 20


def _batch(rows: int, first: float = 1.0) -> dict[str, Array]:
    x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) + 1
    x.flat[0] = first
    return {"x": x}


async def _until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "the pool did not get there in time"
        await asyncio.sleep(0.05)


class Pools:
    """Starts pools of `fake_engine` workers and closes every one at the end of the test."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self.events: list[WorkerEvent] = []
        self._pools: list[ProcessPool] = []

    async def start(
        self, count: int, model_name: str = "m", factory: EngineFactory = fake_engine, **options: float
    ) -> ProcessPool:
        settings = RuntimeSettings(model_dir=self.model_dir, model_name=model_name, log_level="WARNING")
        pool = ProcessPool(count, factory, settings, BUFFER_BYTES, self.events.append, **options)  # type: ignore[arg-type]
        self._pools.append(pool)
        await pool.start([1, 2])
        return pool

    async def close(self) -> None:
        for pool in self._pools:
            await pool.close()


@pytest.fixture
async def pools(tmp_path: Path) -> AsyncIterator[Pools]:
    started = Pools(tmp_path)
    yield started
    await started.close()


async def test_a_pool_starts_its_workers_and_runs_a_merged_batch_through_shared_memory(pools: Pools) -> None:
    pool = await pools.start(2)
    assert (pool.platform, pool.signature, pool.alive) == ("fake", SIGNATURE, 2)
    parts = [_batch(1), _batch(3)]
    out = await pool.run(parts)
    merged = {"x": np.concatenate([p["x"] for p in parts])}
    for name, want in fake_outputs(merged).items():
        np.testing.assert_array_equal(out[name], want)
    assert set(out["pid"].tolist()) < set(pool.pids)  # one worker ran the whole batch
    processes = [w.process for w in pool._workers]
    await pool.close()
    assert [(p.is_alive(), p.exitcode) for p in processes] == [(False, 0), (False, 0)]  # each stopped when told


async def test_a_model_that_cannot_load_fails_the_start_and_leaves_no_worker(pools: Pools) -> None:
    with pytest.raises(ModelLoadError, match="could not load the model: ModelLoadError: the fake model cannot load"):
        await pools.start(1, model_name=CANNOT_LOAD)
    assert not any(w.process.is_alive() for pool in pools._pools for w in pool._workers)


async def test_batches_wait_for_a_free_worker_and_run_side_by_side_on_two(pools: Pools) -> None:
    one = await pools.start(1)
    spans = [out["span"][0] for out in await asyncio.gather(*(one.run([_batch(1, SLOW)]) for _ in range(3)))]
    spans.sort(key=lambda span: span[0])
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans))  # one at a time
    two = await pools.start(2)
    a, b = await asyncio.gather(two.run([_batch(1, SLOW)]), two.run([_batch(1, SLOW)]))
    assert a["pid"][0] != b["pid"][0]
    assert max(a["span"][0][0], b["span"][0][0]) < min(a["span"][0][1], b["span"][0][1])  # at the same time


async def test_a_crashed_worker_is_replaced_and_its_batch_runs_once_more_on_another(pools: Pools) -> None:
    (pools.model_dir / "crash-once").touch()
    pool = await pools.start(2)
    before = set(pool.pids)
    out = await pool.run([_batch(2, CRASH_ONCE)])
    assert out["out"].shape == (2, 4)
    assert out["pid"][0] in before
    crashed = next(e for e in pools.events if e.exitcode is not None)
    assert (crashed.exitcode, crashed.alive, crashed.gave_up) == (3, 1, False)
    await _until(lambda: pool.alive == 2)
    assert len(set(pool.pids) - before) == 1  # one new process in the dead one's place
    assert pools.events[-1] == WorkerEvent(crashed.index, None, 2)


async def test_a_batch_that_kills_every_worker_it_meets_is_worker_lost_after_two_tries(pools: Pools) -> None:
    pool = await pools.start(2)
    with pytest.raises(WorkerLost, match="twice; retry the request"):
        await pool.run([_batch(1, CRASH)])
    assert [e.exitcode for e in pools.events if e.exitcode is not None] == [3, 3]
    await _until(lambda: pool.alive == 2)
    assert (await pool.run([_batch(1)]))["out"].shape == (1, 4)  # the replacements serve


async def test_an_engine_error_fails_the_batch_and_the_worker_serves_on(pools: Pools) -> None:
    pool = await pools.start(1)
    with pytest.raises(InferenceFailed, match="inference engine failed: ValueError: the fake engine refuses"):
        await pool.run([_batch(1, FAIL)])
    assert (await pool.run([_batch(1)]))["out"].shape == (1, 4)
    assert (pool.alive, pools.events) == (1, [])


async def test_a_hung_batch_is_worker_lost_past_the_batch_timeout_and_its_worker_replaced(pools: Pools) -> None:
    pool = await pools.start(1, batch_timeout_s=0.5)
    (pid,) = pool.pids
    with pytest.raises(WorkerLost, match=r"more than 0\.5 s \(--batch-timeout-s\)"):
        await pool.run([_batch(1, HANG)])
    await _until(lambda: pool.alive == 1 and pool.pids != [pid])
    assert (await pool.run([_batch(1)]))["out"].shape == (1, 4)


def _images(*items: bytes) -> dict[str, Array]:
    return {"image": np.array(list(items), dtype=object)}


async def test_a_group_of_requests_runs_unmerged_on_one_worker_each_answered_with_its_own_outcome(
    pools: Pools,
) -> None:
    pool = await pools.start(1, factory=fake_group_engine)
    assert pool.signature == GROUP_SIGNATURE
    first, refused, second = await pool.run_group([_images(b"abc", b"de"), _images(b"fail"), _images(b"xyz")])
    assert isinstance(first, dict)
    assert isinstance(second, dict)
    assert first["texts"].tolist() == [b"cba", b"ed", b"end"]  # BYTES in and out, rows of its own
    assert second["texts"].tolist() == [b"zyx", b"end"]
    assert set(first["pid"].tolist()) == set(second["pid"].tolist()) == set(pool.pids)
    assert isinstance(refused, InvalidInput)
    assert "refuses b'fail'" in str(refused)


async def test_a_group_whose_worker_dies_runs_once_more_on_another(pools: Pools) -> None:
    (pools.model_dir / "crash-once").touch()
    pool = await pools.start(2, factory=fake_group_engine)
    (outcome,) = await pool.run_group([_images(b"crash-once")])
    assert isinstance(outcome, dict)
    assert outcome["texts"].tolist() == [b"ecno-hsarc", b"end"]
    await _until(lambda: pool.alive == 2)  # the dead one is replaced


async def test_an_engine_that_only_merges_refuses_a_group(pools: Pools) -> None:
    pool = await pools.start(1)
    with pytest.raises(InferenceFailed, match="runs merged batches, not groups"):
        await pool.run_group([_batch(1)])
    np.testing.assert_array_equal((await pool.run([_batch(1)]))["out"], fake_outputs(_batch(1))["out"])  # still serves
