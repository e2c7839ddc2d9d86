"""One engine on one dedicated thread of this process: the engine is created, warmed and run there only.

For a program that embeds the service in its own process (and for the service's tests). The server does not use it:
`run()` holds the GIL, so while a batch runs here the process's event loop waits; `skiff-runtime serve` runs even a
single worker as a process (workers.process).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from skiff_runtime.batching.batcher import Outcome
from skiff_runtime.batching.merge import merge_inputs
from skiff_runtime.errors import InferenceFailed, ModelNotReady, SkiffError
from skiff_runtime.predictor.engine import NO_RANGES, Engine, GroupEngine, warm_up
from skiff_runtime.settings import ShapeRange
from skiff_runtime.tensors import Array, ModelSignature
from skiff_runtime.timing import ENGINE_RUN, now_ns


class ThreadWorker:
    """`Workers` with count 1, in-process. Inference never runs on the event loop."""

    count = 1

    def __init__(
        self, engine_factory: Callable[[], Engine], shape_ranges: Mapping[str, ShapeRange] = NO_RANGES
    ) -> None:
        self._engine_factory = engine_factory
        self._shape_ranges = shape_ranges  # TensorRT's: warmed at their min, opt and max
        self._engine: Engine | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="infer")

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise ModelNotReady("the model is not loaded yet")
        return self._engine

    @property
    def platform(self) -> str:
        return self.engine.platform

    @property
    def signature(self) -> ModelSignature:
        return self.engine.signature

    def _load(self, batch_sizes: Sequence[int]) -> Engine:
        engine = self._engine_factory()
        warm_up(engine, batch_sizes, self._shape_ranges)
        return engine

    async def start(self, warmup_batch_sizes: Sequence[int]) -> None:
        loop = asyncio.get_running_loop()
        self._engine = await loop.run_in_executor(self._executor, self._load, list(warmup_batch_sizes))

    def _run(self, parts: Sequence[Mapping[str, Array]]) -> dict[str, Array]:
        try:
            return self.engine.run(merge_inputs(parts))
        except SkiffError:
            raise
        except Exception as exc:
            raise InferenceFailed(f"inference engine failed: {type(exc).__name__}: {exc}") from exc

    async def run(self, parts: Sequence[Mapping[str, Array]]) -> dict[str, Array]:
        started = now_ns()
        outputs = await asyncio.get_running_loop().run_in_executor(self._executor, self._run, parts)
        ENGINE_RUN.set((started, now_ns()))  # measured around the executor call: the thread hand-off included
        return outputs

    def _run_group(self, requests: Sequence[Mapping[str, Array]]) -> list[Outcome]:
        engine = self.engine
        if not isinstance(engine, GroupEngine):
            raise InferenceFailed(f"the {engine.platform} engine runs merged batches, not groups of requests")
        try:
            return engine.run_group(requests)
        except SkiffError:
            raise
        except Exception as exc:
            raise InferenceFailed(f"inference engine failed: {type(exc).__name__}: {exc}") from exc

    async def run_group(self, requests: Sequence[Mapping[str, Array]]) -> list[Outcome]:
        started = now_ns()
        outcomes = await asyncio.get_running_loop().run_in_executor(self._executor, self._run_group, requests)
        ENGINE_RUN.set((started, now_ns()))
        return outcomes

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, lambda: self._executor.shutdown(cancel_futures=True))
