"""The TensorRT engine cache on a volume that outlives pods: one directory per engine key, published atomically.

Layout: `<root>/<key>/` holds what Paddle serialized (set_optim_cache_dir) and `COMPLETE`, a JSON marker listing
every file with its size, written last. An entry is built in `<root>/.build-<key>-<pid>/` and renamed into place,
so a reader never sees half an engine; `<root>/<key>.lock` (flock) makes the first process build while the others
wait up to `wait_s`, then build a private copy that is not published. An entry whose marker is missing, unreadable
or does not match its files is removed and rebuilt. After a publish, the least recently used entries are evicted
until the root is under `max_bytes`. The builder is a callable, so the logic is tested with no GPU.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Generic, TypeVar

from skiff_runtime.settings import RuntimeSettings

MARKER = "COMPLETE"
BUILD_PREFIX = ".build-"
LOCK_SUFFIX = ".lock"
POLL_S = 0.5

T = TypeVar("T")


class CacheResult(StrEnum):
    """How an engine was obtained (the `result` label of skiff_engine_cache)."""

    HIT = "hit"  # a complete entry was there: no build
    WAITED = "waited"  # another process held the lock and published the entry while this one waited
    BUILT = "built"  # this process built the entry and published it
    MISS = "miss"  # built without publishing: the wait ran out, or the root cannot be written


@dataclass(frozen=True)
class EngineKey:
    """Everything that changes a serialized TensorRT engine; two processes with equal keys can share one."""

    model_digest: str
    device: str  # the GPU's model name ("NVIDIA H200"), or "cpu"
    paddle_version: str
    tensorrt_version: str
    precision: str
    shape_ranges: str  # input=MIN:OPT:MAX;... sorted by input
    max_batch_size: int
    workspace_mb: int
    min_subgraph_size: int

    def digest(self) -> str:
        """The entry's directory name: a readable device/precision prefix and a hash of every field."""
        text = json.dumps(asdict(self), sort_keys=True)
        short = hashlib.sha256(text.encode()).hexdigest()[:24]
        device = "".join(c if c.isalnum() else "-" for c in self.device.lower()).strip("-") or "device"
        return f"{device}-{self.precision}-{short}"


def model_digest(paths: tuple[Path, ...]) -> str:
    """sha256 over the model's files (name and content), the same model in any directory gives the same digest."""
    h = hashlib.sha256()
    for path in sorted(paths, key=lambda p: p.name):
        h.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return "sha256:" + h.hexdigest()


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """What the builder returned, how the cache served it, and the directory Paddle used."""

    value: T
    result: CacheResult
    directory: Path
    seconds: float


def _files(directory: Path) -> dict[str, int]:
    return {
        str(p.relative_to(directory)): p.stat().st_size
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != MARKER
    }


def entry_complete(directory: Path, key: EngineKey) -> bool:
    """The marker is there, names this key, and every file it lists has its recorded size (nothing partial)."""
    try:
        marker = json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(marker, dict) or marker.get("key") != asdict(key):
        return False
    listed = marker.get("files")
    present = _files(directory)  # files Paddle added later (a new calibration table) do not spoil the entry
    return isinstance(listed, dict) and all(present.get(name) == size for name, size in listed.items())


def _write_marker(directory: Path, key: EngineKey) -> None:
    body = json.dumps({"key": asdict(key), "files": _files(directory), "built_at": time.time()}, sort_keys=True)
    tmp = directory / (MARKER + ".tmp")
    with tmp.open("w") as f:
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(directory / MARKER)


def _touch(directory: Path) -> None:
    """Mark an entry as used now: eviction removes the entries whose markers were touched longest ago."""
    with contextlib.suppress(OSError):
        os.utime(directory / MARKER)


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def evict(root: Path, max_bytes: int, keep: str) -> tuple[str, ...]:
    """Remove least recently used complete entries (never `keep`) until the entries total <= max_bytes."""
    entries = []
    for d in root.iterdir():
        marker = d / MARKER
        if d.is_dir() and not d.name.startswith(".") and marker.exists():
            entries.append((marker.stat().st_mtime, d.name, _size(d)))
    total = sum(size for _, _, size in entries)
    removed = []
    for _, name, size in sorted(entries):
        if total <= max_bytes:
            break
        if name == keep:
            continue
        shutil.rmtree(root / name, ignore_errors=True)
        total -= size
        removed.append(name)
    return tuple(removed)


@contextlib.contextmanager
def _lock(path: Path, wait_s: float, clock: Callable[[], float], sleep: Callable[[float], None]) -> Iterator[bool]:
    """Holds `path`'s flock while the block runs; yields False (not held) when wait_s ran out first."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        deadline = clock() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if clock() >= deadline:
                    yield False
                    return
                sleep(POLL_S)
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class EngineCache:
    """A cache root with its bounds: `wait_s` for another builder, `max_bytes` for all entries together."""

    root: Path
    wait_s: float = 1800.0
    max_bytes: int = 20 << 30

    def load(
        self,
        key: EngineKey,
        build: Callable[[Path], T],
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> Outcome[T]:
        """Run `build(directory)` with the directory Paddle should read and write engines in: the published entry
        on a hit, a fresh build directory that is published after `build` returns on a miss."""
        started = clock()
        name = key.digest()
        entry = self.root / name
        if entry_complete(entry, key):
            _touch(entry)
            return Outcome(build(entry), CacheResult.HIT, entry, clock() - started)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            lock_path = self.root / (name + LOCK_SUFFIX)
            lock = _lock(lock_path, self.wait_s, clock, sleep)
        except OSError:
            return self._private(key, build, started, clock)
        with lock as held:
            if not held:  # the builder did not finish in wait_s: build a copy of our own, publish nothing
                return self._private(key, build, started, clock)
            if entry_complete(entry, key):  # built by the process that held the lock
                _touch(entry)
                return Outcome(build(entry), CacheResult.WAITED, entry, clock() - started)
            staging = self.root / f"{BUILD_PREFIX}{name}-{os.getpid()}"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            try:
                value = build(staging)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            _write_marker(staging, key)
            shutil.rmtree(entry, ignore_errors=True)  # a partial or corrupted entry: replaced
            staging.rename(entry)
            evict(self.root, self.max_bytes, keep=name)
            return Outcome(value, CacheResult.BUILT, entry, clock() - started)

    def _private(
        self, key: EngineKey, build: Callable[[Path], T], started: float, clock: Callable[[], float]
    ) -> Outcome[T]:
        directory = Path(tempfile.mkdtemp(prefix=f"skiff-engine-{key.digest()}-"))
        return Outcome(build(directory), CacheResult.MISS, directory, clock() - started)


def _shape(dims: tuple[int, ...]) -> str:
    return "x".join(map(str, dims))


def engine_key(settings: RuntimeSettings, digest: str, device: str, paddle_version: str, trt_version: str) -> EngineKey:
    """The key of the engine these settings build for a model with `digest` on `device` (pure)."""
    ranges = settings.trt_shape_ranges
    return EngineKey(
        model_digest=digest,
        device=device,
        paddle_version=paddle_version,
        tensorrt_version=trt_version,
        precision=str(settings.tensorrt_precision),
        shape_ranges=";".join(
            f"{n}={_shape(ranges[n].min)}:{_shape(ranges[n].opt)}:{_shape(ranges[n].max)}" for n in sorted(ranges)
        ),
        max_batch_size=settings.batching.max_batch_size,
        workspace_mb=settings.trt_workspace_mb,
        min_subgraph_size=settings.trt_min_subgraph_size,
    )


def engine_cache(settings: RuntimeSettings) -> EngineCache | None:
    """The cache --trt-cache-dir names, with its wait and size bounds (None: no cache)."""
    if settings.trt_cache_dir is None:
        return None
    return EngineCache(settings.trt_cache_dir, settings.trt_cache_wait_s, settings.trt_cache_max_gb << 30)
