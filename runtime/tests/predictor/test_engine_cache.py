"""The engine cache's key, atomic publish, lock, corruption handling and eviction, with a fake engine builder."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from skiff_runtime.predictor.engine_cache import (
    MARKER,
    CacheResult,
    EngineCache,
    EngineKey,
    entry_complete,
    evict,
    model_digest,
)

KEY = EngineKey(
    model_digest="sha256:abc",
    device="NVIDIA H200",
    paddle_version="3.0.0",
    tensorrt_version="10.5.0",
    precision="fp16",
    shape_ranges="x=1x3:8x3:32x3",
    max_batch_size=32,
    workspace_mb=1024,
    min_subgraph_size=3,
)


def fake_builder(calls: list[Path], payload: bytes = b"engine") -> object:
    """Stands in for Paddle building a predictor: serializes an 'engine' into the cache dir when it has none."""

    def build(directory: Path) -> str:
        calls.append(directory)
        engine = directory / "trt_serialized_x.engine"
        if not engine.exists():
            engine.write_bytes(payload)
        return engine.read_text()

    return build


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("model_digest", "sha256:def"),
        ("device", "NVIDIA A100-SXM4-80GB"),
        ("paddle_version", "3.1.0"),
        ("tensorrt_version", "8.6.1"),
        ("precision", "int8"),
        ("shape_ranges", "x=1x3:8x3:64x3"),
        ("max_batch_size", 16),
        ("workspace_mb", 2048),
        ("min_subgraph_size", 5),
    ],
)
def test_every_field_changes_the_key(field: str, value: object) -> None:
    other = dataclasses.replace(KEY, **{field: value})
    assert other.digest() != KEY.digest()
    assert KEY.digest() == dataclasses.replace(KEY).digest()


def test_key_names_device_and_precision() -> None:
    assert KEY.digest().startswith("nvidia-h200-fp16-")


def test_model_digest_is_content_not_place(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "m.json").write_text("{}")
        (d / "m.pdiparams").write_bytes(b"\1\2")
    assert model_digest((a / "m.json", a / "m.pdiparams")) == model_digest((b / "m.json", b / "m.pdiparams"))
    (b / "m.pdiparams").write_bytes(b"\1\3")
    assert model_digest((a / "m.json", a / "m.pdiparams")) != model_digest((b / "m.json", b / "m.pdiparams"))


def test_first_load_builds_and_publishes_second_is_a_hit(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path)
    calls: list[Path] = []
    first = cache.load(KEY, fake_builder(calls))
    assert first.result is CacheResult.BUILT
    assert first.directory == tmp_path / KEY.digest()
    assert entry_complete(first.directory, KEY)
    assert calls[0].name.startswith(".build-")  # built aside, renamed into place
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".build-")]
    second = cache.load(KEY, fake_builder(calls, b"rebuilt"))
    assert second.result is CacheResult.HIT
    assert second.value == "engine"  # the published engine was read, not rebuilt
    assert calls[1] == first.directory


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: (d / MARKER).unlink(),  # partial: the process died before the marker
        lambda d: (d / MARKER).write_text("{not json"),
        lambda d: (d / "trt_serialized_x.engine").write_bytes(b"trunc"),  # size no longer matches
        lambda d: (d / "trt_serialized_x.engine").unlink(),
    ],
)
def test_damaged_entry_is_ignored_and_rebuilt(tmp_path: Path, damage: object) -> None:
    cache = EngineCache(tmp_path)
    entry = cache.load(KEY, fake_builder([])).directory
    damage(entry)  # type: ignore[operator]
    assert not entry_complete(entry, KEY)
    again = cache.load(KEY, fake_builder([], b"fresh"))
    assert again.result is CacheResult.BUILT
    assert again.value == "fresh"
    assert entry_complete(entry, KEY)


def test_marker_of_another_key_is_not_a_hit(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path)
    entry = cache.load(KEY, fake_builder([])).directory
    marker = json.loads((entry / MARKER).read_text())
    marker["key"]["precision"] = "fp32"
    (entry / MARKER).write_text(json.dumps(marker))
    assert cache.load(KEY, fake_builder([])).result is CacheResult.BUILT


def test_failed_build_leaves_nothing_published(tmp_path: Path) -> None:
    def broken(directory: Path) -> None:
        (directory / "half.engine").write_bytes(b"x")
        raise RuntimeError("TensorRT ran out of workspace")

    with pytest.raises(RuntimeError):
        EngineCache(tmp_path).load(KEY, broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == [KEY.digest() + ".lock"]


def _hold_lock_and_build(root: str, started: object, release: object) -> None:
    def slow(directory: Path) -> str:
        started.set()  # type: ignore[attr-defined]
        release.wait(30)  # type: ignore[attr-defined]
        (directory / "trt_serialized_x.engine").write_bytes(b"by-first")
        return "first"

    EngineCache(Path(root)).load(KEY, slow)


def test_second_process_waits_for_the_first_builder(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    started, release = ctx.Event(), ctx.Event()
    first = ctx.Process(target=_hold_lock_and_build, args=(str(tmp_path), started, release))
    first.start()
    try:
        assert started.wait(60)
        ticks = iter(range(10_000))
        sleeps: list[float] = []

        def sleep(s: float) -> None:
            sleeps.append(s)
            if len(sleeps) == 3:
                release.set()
            time.sleep(0.05)

        calls: list[Path] = []
        outcome = EngineCache(tmp_path, wait_s=1e6).load(KEY, fake_builder(calls), lambda: next(ticks), sleep)
    finally:
        release.set()
        first.join(30)
    assert outcome.result is CacheResult.WAITED
    assert outcome.value == "by-first"  # read what the first process published
    assert len(sleeps) >= 3


def test_wait_runs_out_then_builds_privately(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    started, release = ctx.Event(), ctx.Event()
    first = ctx.Process(target=_hold_lock_and_build, args=(str(tmp_path), started, release))
    first.start()
    try:
        assert started.wait(60)
        now = [0.0]

        def sleep(s: float) -> None:
            now[0] += s

        outcome = EngineCache(tmp_path, wait_s=2.0).load(KEY, fake_builder([], b"mine"), lambda: now[0], sleep)
    finally:
        release.set()
        first.join(30)
    assert outcome.result is CacheResult.MISS
    assert outcome.value == "mine"
    assert not outcome.directory.is_relative_to(tmp_path)  # nothing of ours published
    assert entry_complete(tmp_path / KEY.digest(), KEY)  # the first builder still published


def test_eviction_removes_least_recently_used(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path, max_bytes=1 << 40)
    keys = [dataclasses.replace(KEY, model_digest=f"sha256:{i}") for i in range(3)]
    for i, key in enumerate(keys):
        entry = cache.load(key, fake_builder([], b"x" * 1000)).directory
        os.utime(entry / MARKER, (1000 + i, 1000 + i))
    os.utime(tmp_path / keys[0].digest() / MARKER)  # key 0 used just now: key 1 is the oldest
    sizes = [sum(f.stat().st_size for f in (tmp_path / k.digest()).iterdir()) for k in keys]
    removed = evict(tmp_path, sum(sizes) - 1, keep=keys[2].digest())  # one entry over the bound
    assert removed == (keys[1].digest(),)
    assert {p.name for p in tmp_path.iterdir() if p.is_dir()} == {keys[0].digest(), keys[2].digest()}


def test_publish_evicts_beyond_the_bound_but_never_the_new_entry(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path, max_bytes=500)
    old = dataclasses.replace(KEY, model_digest="sha256:old")
    cache.load(old, fake_builder([], b"y" * 400))
    new = cache.load(KEY, fake_builder([], b"z" * 400))
    assert new.result is CacheResult.BUILT
    assert entry_complete(new.directory, KEY)
    assert not (tmp_path / old.digest()).exists()


def test_unwritable_root_runs_without_publishing(tmp_path: Path) -> None:
    root = tmp_path / "file"
    root.write_text("not a directory")
    outcome = EngineCache(root).load(KEY, fake_builder([]))
    assert outcome.result is CacheResult.MISS
