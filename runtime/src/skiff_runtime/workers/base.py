"""What the service needs from its workers: one async `run` per batch (`run_group` for a grouped model, a task),
and events when a worker dies or returns."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from skiff_runtime.batching.batcher import Outcome
from skiff_runtime.tensors import Array, ModelSignature


@dataclass(frozen=True)
class WorkerEvent:
    """A worker process exited, or its replacement became ready. `alive` counts the workers able to run batches
    afterwards; `gave_up` means the pool will not replace it (the replacement failed to load, or workers died too
    often) and the server should stop so that Kubernetes restarts the pod. `engine_cache`, on a worker that became
    ready, says how --trt-cache-dir served its engine (hit, waited, built, miss; None without a cache)."""

    index: int
    exitcode: int | None
    alive: int
    gave_up: bool = False
    engine_cache: str | None = None


WorkerEvents = Callable[[WorkerEvent], None]


class Workers(Protocol):
    """A set of engines behind one async `run`; each call runs one batch on one free worker."""

    count: int

    @property
    def platform(self) -> str: ...

    @property
    def signature(self) -> ModelSignature: ...

    async def start(self, warmup_batch_sizes: Sequence[int]) -> None: ...

    async def run(self, parts: Sequence[Mapping[str, Array]]) -> dict[str, Array]:
        """Run the concatenation (axis 0) of `parts` as one batch; outputs are owned by the caller."""
        ...

    async def run_group(self, requests: Sequence[Mapping[str, Array]]) -> list[Outcome]:
        """Run a grouped model's requests side by side on one worker, unmerged: one outcome each, in order."""
        ...

    async def close(self) -> None: ...
