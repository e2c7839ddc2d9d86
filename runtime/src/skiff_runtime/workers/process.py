"""A pool of worker processes, one engine each, fed through shared memory: parallelism that the GIL allows.

Paddle's `run()` holds the GIL, so threads add no speed; processes do. This process (the front) keeps gRPC,
validation and batching; each worker process owns one engine. A batch is written once, straight into the
chosen worker's input buffer (an anonymous memfd mapped by both sides), the worker runs it and writes the
outputs into its output buffer, and only small descriptors cross the pipe. If a worker dies, its batch fails
with INTERNAL and `on_worker_exit` is told, so the server can stop and let Kubernetes restart the pod.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle, send_handle
from typing import Any

import numpy as np

from skiff_runtime.errors import InferenceFailed, ModelLoadError, ModelNotReady
from skiff_runtime.logs import configure_logging
from skiff_runtime.tensors import Array, ModelSignature
from skiff_runtime.workers.base import Engine, warm_up
from skiff_runtime.workers.layout import views, write_arrays, write_concatenated

log = logging.getLogger(__name__)

EngineFactory = Callable[[Any], Engine]


def _map(fd: int, size: int) -> mmap.mmap:
    return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def worker_main(conn: Connection, factory: EngineFactory, settings: Any, buffer_bytes: int, nice: int = 0) -> None:
    """Entry point of a worker process: load, warm, then run batches until told to stop or the front dies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the front decides when workers stop
    configure_logging(getattr(settings, "log_level", "INFO"))  # a spawned process starts without handlers
    if nice:
        # Lower priority than the front: when every core is busy with inference, the front still gets the CPU
        # it needs to read requests, refuse overload at once and hand out the next batch (bench/RESULTS.md).
        os.nice(nice)
    in_fd, out_fd = recv_handle(conn), recv_handle(conn)
    inputs_buf, outputs_buf = _map(in_fd, buffer_bytes), _map(out_fd, buffer_bytes)
    try:
        batch_sizes = conn.recv()
        engine = factory(settings)
        warm_up(engine, batch_sizes)
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # Paddle installs its own handler on import
    conn.send(("ready", engine.platform, engine.signature))
    in_view, out_view = memoryview(inputs_buf), memoryview(outputs_buf)
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message[0] == "stop":
            return
        started = time.perf_counter()
        try:
            outputs = engine.run(views(in_view, message[1]))
            descriptors = write_arrays(out_view, outputs, buffer_bytes)
        except Exception as exc:
            conn.send(("error", f"inference engine failed: {type(exc).__name__}: {exc}"))
            continue
        conn.send(("ok", descriptors, time.perf_counter() - started))


@dataclass
class _Worker:
    index: int
    process: multiprocessing.process.BaseProcess
    conn: Connection
    inputs: mmap.mmap
    outputs: mmap.mmap
    reply: asyncio.Future[Any] | None = None


class ProcessPool:
    """`Workers` backed by `count` processes."""

    def __init__(
        self,
        count: int,
        factory: EngineFactory,
        settings: Any,
        buffer_bytes: int,
        on_worker_exit: Callable[[int, int | None], None] | None = None,
        nice: int = 0,
    ) -> None:
        self.count = count
        self._nice = nice
        self._factory = factory
        self._settings = settings
        self._buffer_bytes = buffer_bytes
        self._on_worker_exit = on_worker_exit
        self._workers: list[_Worker] = []
        self._idle: asyncio.Queue[_Worker] | None = None
        self._platform = "unknown"
        self._signature: ModelSignature | None = None
        self._closing = False

    @property
    def platform(self) -> str:
        return self._platform

    @property
    def signature(self) -> ModelSignature:
        if self._signature is None:
            raise ModelNotReady("the model is not loaded yet")
        return self._signature

    @property
    def pids(self) -> list[int | None]:
        return [w.process.pid for w in self._workers]

    def _spawn(self, index: int, batch_sizes: Sequence[int]) -> _Worker:
        context = multiprocessing.get_context("spawn")  # never fork a process that runs gRPC threads
        front, back = context.Pipe(duplex=True)
        process = context.Process(
            target=worker_main,
            args=(back, self._factory, self._settings, self._buffer_bytes, self._nice),
            name=f"skiff-worker-{index}",
            daemon=True,
        )
        process.start()
        back.close()
        fds = [os.memfd_create(f"skiff-worker-{index}-{kind}") for kind in ("in", "out")]
        for fd in fds:
            os.ftruncate(fd, self._buffer_bytes)
            send_handle(front, fd, process.pid)
        maps = [_map(fd, self._buffer_bytes) for fd in fds]
        for fd in fds:
            os.close(fd)
        front.send(list(batch_sizes))
        return _Worker(index, process, front, maps[0], maps[1])

    def _await_ready(self, worker: _Worker) -> tuple[str, ModelSignature]:
        try:
            message = worker.conn.recv()
        except EOFError:
            raise ModelLoadError(
                f"worker {worker.index} exited with code {worker.process.exitcode} while loading"
            ) from None
        if message[0] != "ready":
            raise ModelLoadError(f"worker {worker.index} could not load the model: {message[1]}")
        return message[1], message[2]

    async def start(self, warmup_batch_sizes: Sequence[int]) -> None:
        loop = asyncio.get_running_loop()
        self._workers = [self._spawn(i, warmup_batch_sizes) for i in range(self.count)]
        results = await asyncio.gather(
            *(loop.run_in_executor(None, self._await_ready, w) for w in self._workers), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self.close()
            raise errors[0]
        self._platform, self._signature = results[0]  # type: ignore[misc]
        # Most recently used first: at low load one worker stays hot (its caches hold the model's weights);
        # round-robin over 2 workers on 2 cores cost ~1 ms per MobileNetV3 call (bench/RESULTS.md).
        self._idle = asyncio.LifoQueue()
        for worker in self._workers:
            loop.add_reader(worker.conn.fileno(), self._on_readable, worker)
            self._idle.put_nowait(worker)

    def _on_readable(self, worker: _Worker) -> None:
        try:
            message: Any = worker.conn.recv()
        except (EOFError, OSError):
            asyncio.get_running_loop().remove_reader(worker.conn.fileno())
            worker.process.join(timeout=1)
            message = ("exit", worker.process.exitcode)
            if not self._closing:
                log.error("worker process exited", extra={"worker": worker.index, "exitcode": message[1]})
                if self._on_worker_exit is not None:
                    self._on_worker_exit(worker.index, worker.process.exitcode)
        if worker.reply is not None and not worker.reply.done():
            worker.reply.set_result(message)

    async def run(self, parts: Sequence[Mapping[str, Array]]) -> dict[str, Array]:
        if self._idle is None:
            raise ModelNotReady("the model is not loaded yet")
        worker = await self._idle.get()
        try:
            descriptors = write_concatenated(memoryview(worker.inputs), parts, self._buffer_bytes)
            worker.reply = asyncio.get_running_loop().create_future()
            worker.conn.send(("run", descriptors))
            message = await worker.reply
            if message[0] == "exit":
                raise InferenceFailed(f"worker {worker.index} exited (code {message[1]}) while running the batch")
            if message[0] == "error":
                raise InferenceFailed(message[1])
            # Copy the outputs out of shared memory: the buffer is reused by the next batch.
            return {name: np.array(view) for name, view in views(memoryview(worker.outputs), message[1]).items()}
        finally:
            worker.reply = None
            if worker.process.is_alive():
                self._idle.put_nowait(worker)

    async def close(self) -> None:
        self._closing = True
        loop = asyncio.get_running_loop()
        for worker in self._workers:
            try:
                loop.remove_reader(worker.conn.fileno())
                worker.conn.send(("stop",))
            except (OSError, ValueError):
                pass
        for worker in self._workers:
            await loop.run_in_executor(None, worker.process.join, 10)
            if worker.process.is_alive():
                worker.process.kill()
            worker.conn.close()
