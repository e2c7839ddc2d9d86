"""A pool of worker processes, one engine each, fed through shared memory: parallelism that the GIL allows.

Paddle's `run()` holds the GIL, so threads add no speed; processes do. This process (the front) keeps gRPC,
validation and batching; each worker process owns one engine. A batch is written once, straight into the
chosen worker's input buffer (an anonymous memfd mapped by both sides), the worker runs it and writes the
outputs into its output buffer, and only small typed messages cross the pipe: Warm, RunBatch and Stop to a worker,
Ready, LoadFailed, BatchDone and BatchFailed back, each a frozen dataclass holding the buffers' descriptors.
A grouped model's requests (a task's: PNG/JPEG bytes, outputs of their own length) cross the pipe itself, pickled,
as RunGroup and GroupDone: they are Python objects shared memory cannot place, and each is bounded by the byte
budget and the message size (the worker decodes the images; the crops and model inputs never cross).

A worker that dies (a native crash, an OOM kill) is replaced by a new process and its batch runs once more on
another worker; a batch that fails twice that way, or runs past `batch_timeout_s` (its worker is killed and
replaced), fails with WorkerLost (UNAVAILABLE: the client may retry). `on_event` hears every exit and every
replacement; when a replacement cannot load, or workers die more than MAX_RESTARTS times in RESTART_WINDOW_S, the
pool gives up on that worker and says so, and the server stops so that Kubernetes restarts the pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
import multiprocessing
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle, send_handle
from typing import TypeVar

import numpy as np

from skiff_runtime.batching.batcher import Outcome
from skiff_runtime.errors import InferenceFailed, ModelLoadError, ModelNotReady, WorkerLost
from skiff_runtime.logs import configure_logging
from skiff_runtime.predictor.engine import Engine, GroupEngine, warm_up, warmup_shape_ranges
from skiff_runtime.settings import RuntimeSettings
from skiff_runtime.tensors import Array, ModelSignature
from skiff_runtime.timing import ENGINE_RUN
from skiff_runtime.workers.base import WorkerEvent, WorkerEvents
from skiff_runtime.workers.layout import Descriptor, views, write_arrays, write_batch

log = logging.getLogger(__name__)
T = TypeVar("T")

# Builds a worker's engine from the settings, in the worker process: a module-level function (it is pickled).
EngineFactory = Callable[[RuntimeSettings], Engine]


# The pipe between the front and a worker speaks these messages, one frozen dataclass each (pickled whole).
@dataclass(frozen=True)
class Warm:
    """Front -> worker, once, after the buffers: load the engine and run each batch size once."""

    batch_sizes: tuple[int, ...]


@dataclass(frozen=True)
class RunBatch:
    """Front -> worker: run the batch whose inputs these descriptors place in the input buffer."""

    inputs: tuple[Descriptor, ...]


@dataclass(frozen=True)
class RunGroup:
    """Front -> worker: run these requests of a grouped model side by side (pickled: BYTES are objects)."""

    requests: tuple[Mapping[str, Array], ...]


@dataclass(frozen=True)
class Stop:
    """Front -> worker: exit now."""


@dataclass(frozen=True)
class Ready:
    """Worker -> front: loaded and warmed; what the engine serves."""

    platform: str
    signature: ModelSignature
    engine_cache: str | None = None  # how --trt-cache-dir served the engine (predictor.engine_cache.CacheResult)


@dataclass(frozen=True)
class LoadFailed:
    """Worker -> front: the engine could not load or warm up (the worker exits)."""

    reason: str


@dataclass(frozen=True)
class BatchDone:
    """Worker -> front: the outputs are in the output buffer where these descriptors say."""

    outputs: tuple[Descriptor, ...]
    seconds: float
    finished_ns: int = 0  # the worker's wall clock when the run ended (timing.ENGINE_RUN)


@dataclass(frozen=True)
class GroupDone:
    """Worker -> front: each request's outputs or its own error, in order."""

    outcomes: tuple[Outcome, ...]
    seconds: float
    finished_ns: int = 0


@dataclass(frozen=True)
class BatchFailed:
    """Worker -> front: the engine raised on the batch (the worker goes on)."""

    reason: str


@dataclass(frozen=True)
class Exited:
    """Not sent: what the front makes of a worker whose pipe closed (it died) while a batch was running."""

    exitcode: int | None


ToWorker = Warm | RunBatch | RunGroup | Stop
FromWorker = Ready | LoadFailed | BatchDone | GroupDone | BatchFailed
BatchReply = BatchDone | GroupDone | BatchFailed | Exited


def _receive_from_front(conn: Connection) -> ToWorker:
    message = conn.recv()
    if not isinstance(message, Warm | RunBatch | RunGroup | Stop):
        raise TypeError(
            f"a worker received {type(message).__name__} from the front; it takes Warm, RunBatch, RunGroup, Stop"
        )
    return message


def _receive_from_worker(conn: Connection) -> FromWorker:
    message = conn.recv()
    if not isinstance(message, Ready | LoadFailed | BatchDone | GroupDone | BatchFailed):
        raise TypeError(f"the front received {type(message).__name__} from a worker")
    return message


MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0


@contextlib.contextmanager
def _environment(extra: Mapping[str, str]) -> Iterator[None]:
    """os.environ with `extra` set, restored afterwards (spawning runs on the event loop's thread only)."""
    saved = {name: os.environ.get(name) for name in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class _WorkerDied(Exception):
    """The worker running a batch exited before answering."""


def _map(fd: int, size: int) -> mmap.mmap:
    return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def worker_main(
    conn: Connection, factory: EngineFactory, settings: RuntimeSettings, buffer_bytes: int, nice: int = 0
) -> None:
    """Entry point of a worker process: load, warm, then run batches until told to stop or the front dies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the front decides when workers stop
    configure_logging(settings.log_level)  # a spawned process starts without handlers
    if nice:
        # Lower priority than the front: when every core is busy with inference, the front still gets the CPU
        # it needs to read requests, refuse overload at once and hand out the next batch (bench/RESULTS.md).
        os.nice(nice)
    in_fd, out_fd = recv_handle(conn), recv_handle(conn)
    inputs_buf, outputs_buf = _map(in_fd, buffer_bytes), _map(out_fd, buffer_bytes)
    try:
        warm = _receive_from_front(conn)
        if not isinstance(warm, Warm):
            raise TypeError(f"the first message was {type(warm).__name__}, not Warm")
        engine = factory(settings)
        warm_up(engine, warm.batch_sizes, warmup_shape_ranges(settings))
    except Exception as exc:
        conn.send(LoadFailed(f"{type(exc).__name__}: {exc}"))
        return
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # Paddle installs its own handler on import
    cache_result = getattr(engine, "cache_result", None)  # PaddleEngine's; task engines have none
    conn.send(Ready(engine.platform, engine.signature, None if cache_result is None else str(cache_result)))
    in_view, out_view = memoryview(inputs_buf), memoryview(outputs_buf)
    while True:
        try:
            message = _receive_from_front(conn)
        except EOFError:
            return
        if isinstance(message, RunGroup):
            conn.send(_run_group(engine, message))
            continue
        if not isinstance(message, RunBatch):
            return  # Stop (a second Warm is no request either)
        started = time.perf_counter()
        try:
            outputs = engine.run(views(in_view, message.inputs))
            descriptors = write_arrays(out_view, outputs, buffer_bytes)
        except Exception as exc:
            conn.send(BatchFailed(f"inference engine failed: {type(exc).__name__}: {exc}"))
            continue
        conn.send(BatchDone(tuple(descriptors), time.perf_counter() - started, time.time_ns()))


def _run_group(engine: Engine, message: RunGroup) -> GroupDone | BatchFailed:
    started = time.perf_counter()
    if not isinstance(engine, GroupEngine):
        return BatchFailed(f"the {engine.platform} engine runs merged batches, not groups of requests")
    try:
        outcomes = engine.run_group(message.requests)
    except Exception as exc:
        return BatchFailed(f"inference engine failed: {type(exc).__name__}: {exc}")
    return GroupDone(tuple(outcomes), time.perf_counter() - started, time.time_ns())


@dataclass
class _Worker:
    index: int
    process: multiprocessing.process.BaseProcess
    conn: Connection
    inputs: mmap.mmap
    outputs: mmap.mmap
    reply: asyncio.Future[BatchReply] | None = None
    ready: bool = False  # loaded, warmed and watched by the event loop
    dead: bool = False
    engine_cache: str | None = None  # from its Ready message


class ProcessPool:
    """`Workers` backed by `count` processes."""

    def __init__(
        self,
        count: int,
        factory: EngineFactory,
        settings: RuntimeSettings,
        buffer_bytes: int,
        on_event: WorkerEvents | None = None,
        nice: int = 0,
        batch_timeout_s: float = 0.0,
        environments: Sequence[Mapping[str, str]] = (),
    ) -> None:
        self.count = count
        self._environments = environments  # worker i's extra variables (CUDA_VISIBLE_DEVICES), when given
        self._nice = nice
        self._factory = factory
        self._settings = settings
        self._buffer_bytes = buffer_bytes
        self._on_event = on_event
        self._batch_timeout_s = batch_timeout_s
        self._workers: list[_Worker] = []
        self._idle: asyncio.Queue[_Worker] | None = None
        self._platform = "unknown"
        self._signature: ModelSignature | None = None
        self._closing = False
        self._warmup_batch_sizes: list[int] = []
        self._restarts: list[float] = []
        self._respawning: set[asyncio.Task[None]] = set()

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

    @property
    def alive(self) -> int:
        """Workers able to run a batch now (loaded, not dead)."""
        return sum(1 for w in self._workers if w.ready and not w.dead)

    def _spawn(self, index: int, batch_sizes: Sequence[int]) -> _Worker:
        context = multiprocessing.get_context("spawn")  # never fork a process that runs gRPC threads
        front, back = context.Pipe(duplex=True)
        process = context.Process(
            target=worker_main,
            args=(back, self._factory, self._settings, self._buffer_bytes, self._nice),
            name=f"skiff-worker-{index}",
            daemon=True,
        )
        extra = dict(self._environments[index]) if index < len(self._environments) else {}
        with _environment(extra):  # a spawned process starts with this process's environment
            process.start()
        back.close()
        if extra:
            log.info("worker process started", extra={"worker": index, "pid": process.pid, **extra})
        fds = [os.memfd_create(f"skiff-worker-{index}-{kind}") for kind in ("in", "out")]
        for fd in fds:
            os.ftruncate(fd, self._buffer_bytes)
            send_handle(front, fd, process.pid)
        maps = [_map(fd, self._buffer_bytes) for fd in fds]
        for fd in fds:
            os.close(fd)
        front.send(Warm(tuple(batch_sizes)))
        return _Worker(index, process, front, maps[0], maps[1])

    def _await_ready(self, worker: _Worker) -> tuple[str, ModelSignature]:
        try:
            message = _receive_from_worker(worker.conn)
        except EOFError:
            raise ModelLoadError(
                f"worker {worker.index} exited with code {worker.process.exitcode} while loading"
            ) from None
        if isinstance(message, LoadFailed):
            raise ModelLoadError(f"worker {worker.index} could not load the model: {message.reason}")
        if not isinstance(message, Ready):
            raise ModelLoadError(f"worker {worker.index} sent {type(message).__name__} before it was Ready")
        worker.engine_cache = message.engine_cache
        return message.platform, message.signature

    async def start(self, warmup_batch_sizes: Sequence[int]) -> None:
        loop = asyncio.get_running_loop()
        self._warmup_batch_sizes = list(warmup_batch_sizes)
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
            self._watch(worker)
        for worker in self._workers:
            if worker.engine_cache is not None:
                self._notify(worker, ready=True)

    def _watch(self, worker: _Worker) -> None:
        assert self._idle is not None
        worker.ready = True
        asyncio.get_running_loop().add_reader(worker.conn.fileno(), self._on_readable, worker)
        self._idle.put_nowait(worker)

    def _notify(self, worker: _Worker, gave_up: bool = False, ready: bool = False) -> None:
        if self._on_event is not None:
            cache = worker.engine_cache if ready else None
            self._on_event(WorkerEvent(worker.index, worker.process.exitcode, self.alive, gave_up, cache))

    def _on_readable(self, worker: _Worker) -> None:
        message: BatchReply
        try:
            received = _receive_from_worker(worker.conn)
        except (EOFError, OSError):
            asyncio.get_running_loop().remove_reader(worker.conn.fileno())
            worker.process.join(timeout=1)
            worker.dead = True
            message = Exited(worker.process.exitcode)
            if not self._closing:
                self._replace(worker)
        else:
            if not isinstance(received, BatchDone | GroupDone | BatchFailed):
                log.error("a worker sent an unexpected message", extra={"worker": worker.index, "message": received})
                return
            message = received
        if worker.reply is not None and not worker.reply.done():
            worker.reply.set_result(message)

    def _replace(self, worker: _Worker) -> None:
        """Start a new process in a dead worker's place, unless workers die too often."""
        now = time.monotonic()
        self._restarts = [t for t in self._restarts if now - t < RESTART_WINDOW_S] + [now]
        gave_up = len(self._restarts) > MAX_RESTARTS
        log.error(
            "worker process exited" + ("; too many restarts, giving up" if gave_up else "; starting a new one"),
            extra={"worker": worker.index, "exitcode": worker.process.exitcode, "alive": self.alive},
        )
        self._notify(worker, gave_up)
        if not gave_up:
            task = asyncio.create_task(self._respawn(worker.index))
            self._respawning.add(task)
            task.add_done_callback(self._respawning.discard)

    async def _respawn(self, index: int) -> None:
        loop = asyncio.get_running_loop()
        old = self._workers[index]
        new = self._spawn(index, self._warmup_batch_sizes)
        self._workers[index] = new
        old.conn.close()
        try:
            await loop.run_in_executor(None, self._await_ready, new)
        except ModelLoadError as exc:
            new.dead = True
            if not self._closing:
                log.error("the replacement worker could not load the model", extra={"worker": index, "error": str(exc)})
                self._notify(new, gave_up=True)
            return
        if self._closing:
            return
        self._watch(new)
        log.info("worker process replaced", extra={"worker": index, "pid": new.process.pid, "alive": self.alive})
        self._notify(new, ready=True)

    async def _idle_worker(self) -> _Worker:
        assert self._idle is not None
        while True:
            worker = await self._idle.get()
            if not worker.dead:
                return worker

    async def run(self, parts: Sequence[Mapping[str, Array]]) -> dict[str, Array]:
        outputs: dict[str, Array] = await self._twice(self._run_once, parts)
        return outputs

    async def run_group(self, requests: Sequence[Mapping[str, Array]]) -> list[Outcome]:
        outcomes: list[Outcome] = await self._twice(self._run_group_once, requests)
        return outcomes

    async def _twice(
        self, once: Callable[[Sequence[Mapping[str, Array]]], Awaitable[T]], parts: Sequence[Mapping[str, Array]]
    ) -> T:
        """`once(parts)`, run again on another worker when its worker died; WorkerLost when that one died too."""
        if self._idle is None:
            raise ModelNotReady("the model is not loaded yet")
        try:
            return await once(parts)
        except _WorkerDied as died:
            log.warning("retrying a batch on another worker", extra={"reason": str(died)})
        try:
            return await once(parts)
        except _WorkerDied as died:
            raise WorkerLost(f"{died}, twice; retry the request") from None

    async def _run_once(self, parts: Sequence[Mapping[str, Array]]) -> dict[str, Array]:
        def send(worker: _Worker) -> RunBatch:
            return RunBatch(tuple(write_batch(memoryview(worker.inputs), parts, self._buffer_bytes)))

        def read(worker: _Worker, message: BatchDone | GroupDone) -> dict[str, Array]:
            if not isinstance(message, BatchDone):
                raise InferenceFailed(f"worker {worker.index} answered a batch with {type(message).__name__}")
            # Copy the outputs out of shared memory: the buffer is reused by the next batch.
            return {name: np.array(view) for name, view in views(memoryview(worker.outputs), message.outputs).items()}

        return await self._exchange(send, read)

    async def _run_group_once(self, requests: Sequence[Mapping[str, Array]]) -> list[Outcome]:
        def read(worker: _Worker, message: BatchDone | GroupDone) -> list[Outcome]:
            if not isinstance(message, GroupDone):
                raise InferenceFailed(f"worker {worker.index} answered a group with {type(message).__name__}")
            return list(message.outcomes)

        return await self._exchange(lambda _: RunGroup(tuple(requests)), read)

    async def _exchange(
        self, send: Callable[[_Worker], RunBatch | RunGroup], read: Callable[[_Worker, BatchDone | GroupDone], T]
    ) -> T:
        """Send an idle worker the message `send` builds (it may write the worker's buffer) and `read` its answer
        while the worker is still this call's; a batch's failure raises InferenceFailed, a death _WorkerDied."""
        assert self._idle is not None
        worker = await self._idle_worker()
        try:
            request = send(worker)
            worker.reply = asyncio.get_running_loop().create_future()
            try:
                worker.conn.send(request)
            except OSError:
                worker.reply.set_result(Exited(worker.process.exitcode))
            message = await self._answer(worker, worker.reply)
            if isinstance(message, Exited):
                raise _WorkerDied(f"worker {worker.index} exited (code {message.exitcode}) while running the batch")
            if isinstance(message, BatchFailed):
                raise InferenceFailed(message.reason)
            ENGINE_RUN.set((message.finished_ns - int(message.seconds * 1e9), message.finished_ns))
            return read(worker, message)
        finally:
            worker.reply = None
            if not worker.dead and worker.process.is_alive():
                self._idle.put_nowait(worker)

    async def _answer(self, worker: _Worker, reply: asyncio.Future[BatchReply]) -> BatchReply:
        """The worker's answer; one that hangs past batch_timeout_s is killed (and replaced) and WorkerLost."""
        if not self._batch_timeout_s:
            return await reply
        try:
            return await asyncio.wait_for(asyncio.shield(reply), self._batch_timeout_s)
        except TimeoutError:
            worker.dead = True
            worker.process.kill()  # its pipe closes: _on_readable replaces it
            self._notify(worker)  # health hears of it now, not when the pipe's end is read
            raise WorkerLost(
                f"worker {worker.index} ran a batch for more than {self._batch_timeout_s:g} s "
                "(--batch-timeout-s); it was stopped and is being replaced. Retry the request"
            ) from None

    async def close(self) -> None:
        self._closing = True
        loop = asyncio.get_running_loop()
        for worker in self._workers:
            try:
                loop.remove_reader(worker.conn.fileno())
                worker.conn.send(Stop())
            except (OSError, ValueError):
                pass
            if not worker.ready:  # a replacement still loading: it would not read the stop message yet
                worker.process.kill()
        for worker in self._workers:
            await loop.run_in_executor(None, worker.process.join, 10)
            if worker.process.is_alive():
                worker.process.kill()
            worker.conn.close()
