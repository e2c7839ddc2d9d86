"""The served runtime with --trt-cache-dir: two workers build one entry between them, a restart starts warm, and
skiff_engine_cache{result} and the "engine cache" log line say so."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.paddle, pytest.mark.slow]


def _cache_counts(runtime) -> dict[str, float]:  # type: ignore[no-untyped-def]
    return {s.labels["result"]: s.value for s in runtime.metric_samples() if s.name == "skiff_engine_cache_total"}


def test_two_workers_share_one_entry_and_a_restart_is_a_hit(model_dirs, runtime_factory, tmp_path: Path) -> None:
    cache = tmp_path / "engines"
    first = runtime_factory(model_dirs["conv"], "conv", "--workers", "2", "--trt-cache-dir", str(cache))
    first.wait_serving()
    counts = _cache_counts(first)
    assert counts.get("built") == 1  # one worker built under the lock ...
    assert counts.get("waited", 0) + counts.get("hit", 0) == 1  # ... the other waited for it or found it
    assert counts.get("miss", 0) == 0
    logged = sorted(str(e["result"]) for e in first.logs() if e.get("msg") == "engine cache")
    assert len(logged) == 2
    assert "built" in logged
    assert first.terminate() == 0
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 1

    second = runtime_factory(model_dirs["conv"], "conv", "--workers", "1", "--trt-cache-dir", str(cache))
    second.wait_serving()
    assert _cache_counts(second) == {"hit": 1}
