"""Fixtures for runtime tests: sample Paddle models exported by the tests, and real runtime processes."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

HAVE_PADDLE = importlib.util.find_spec("paddle") is not None
needs_paddle = pytest.mark.skipif(
    not HAVE_PADDLE, reason="paddlepaddle is not installed; run `make test` (it installs the pinned CPU build)"
)


def export_sample(kind: str, directory: Path, *, legacy: bool = False) -> Path:
    env = dict(os.environ, FLAGS_enable_pir_api="0") if legacy else dict(os.environ)
    subprocess.run(
        [sys.executable, "-m", "skiff_runtime.samples", kind, str(directory)],
        check=True,
        env=env,
        capture_output=True,
    )
    return directory


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """conv (Paddle 3.x json), two_io (two inputs/outputs, FP32+INT64) and legacy (Paddle 2.x .pdmodel)."""
    if not HAVE_PADDLE:
        pytest.skip("paddlepaddle is not installed; run `make test` (it installs the pinned CPU build)")
    root = tmp_path_factory.mktemp("models")
    return {
        "conv": export_sample("conv", root / "conv"),
        "two_io": export_sample("two_io", root / "two_io"),
        "legacy": export_sample("conv", root / "legacy", legacy=True),
        "conv_dynamic": export_sample("conv_dynamic", root / "conv_dynamic"),
    }


@dataclass
class RuntimeProcess:
    """A real `skiff-runtime serve` process on 127.0.0.1 with OS-chosen ports."""

    model_dir: Path
    model_name: str
    log_path: Path
    extra_args: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    grpc_port: int = 0
    health_port: int = 0
    metrics_port: int = 0
    http_port: int = 0

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def health_target(self) -> str:
        return f"127.0.0.1:{self.health_port}"

    @property
    def stdout_path(self) -> Path:
        return self.log_path.with_suffix(".stdout")

    def metric_samples(self) -> list[Sample]:
        """Every sample of the runtime's /metrics page, as it is now."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        return [sample for family in text_string_to_metric_families(text) for sample in family.samples]

    def logs(self) -> list[dict[str, object]]:
        entries = []
        for line in self.log_path.read_text().splitlines():
            if line.startswith("{"):
                entries.append(json.loads(line))
        return entries

    def start(self) -> RuntimeProcess:
        cmd = [sys.executable, "-m", "skiff_runtime", "serve", "--model-dir", str(self.model_dir),
               "--model-name", self.model_name, "--host", "127.0.0.1", "--grpc-port", "0",
               "--health-port", "0", "--metrics-port", "0", *self.extra_args]  # fmt: skip
        stdout = self.stdout_path.open("wb")  # payload log lines (--payload-log-sink stdout)
        self.proc = subprocess.Popen(cmd, stderr=self.log_path.open("wb"), stdout=stdout)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            listening = [e for e in self.logs() if e.get("msg") == "listening"]
            if listening:
                self.grpc_port = int(listening[0]["grpc_port"])  # type: ignore[call-overload]
                self.health_port = int(listening[0]["health_port"])  # type: ignore[call-overload]
                self.metrics_port = int(listening[0]["metrics_port"])  # type: ignore[call-overload]
                self.http_port = int(listening[0].get("http_port") or 0)  # type: ignore[call-overload]
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"runtime exited with {self.proc.returncode}:\n{self.log_path.read_text()}")
            time.sleep(0.05)
        raise RuntimeError(f"runtime did not open its ports:\n{self.log_path.read_text()}")

    def wait_serving(self, timeout_s: float = 90) -> None:
        from skiff_runtime.client import SkiffClient

        deadline = time.monotonic() + timeout_s
        with SkiffClient(self.health_target, timeout_s=2) as client:
            while time.monotonic() < deadline:
                if client.health(self.model_name) == "SERVING":
                    return
                assert self.proc is not None
                assert self.proc.poll() is None, self.log_path.read_text()
                time.sleep(0.1)
        raise AssertionError(f"not SERVING after {timeout_s}s:\n{self.log_path.read_text()}")

    def terminate(self, timeout_s: float = 60) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout_s)


@pytest.fixture
def runtime_factory(tmp_path: Path) -> Iterator[type[RuntimeProcess]]:
    started: list[RuntimeProcess] = []

    def make(model_dir: Path, model_name: str, *extra: str) -> RuntimeProcess:
        runtime = RuntimeProcess(model_dir, model_name, tmp_path / f"{model_name}-{len(started)}.log", list(extra))
        started.append(runtime)
        return runtime.start()

    yield make  # type: ignore[misc]
    for runtime in started:
        if runtime.proc and runtime.proc.poll() is None:
            runtime.proc.kill()
            runtime.proc.wait()


def _serve_session(tmp_path_factory: pytest.TempPathFactory, model_dir: Path, name: str) -> Iterator[RuntimeProcess]:
    runtime = RuntimeProcess(
        model_dir,
        name,
        tmp_path_factory.mktemp("logs") / f"{name}.log",
        ["--max-batch-size", "8", "--workers", "2", "--http-port", "0"],
    )
    runtime.start().wait_serving()
    yield runtime
    assert runtime.terminate() == 0, runtime.log_path.read_text()


@pytest.fixture(scope="session")
def conv_server(tmp_path_factory: pytest.TempPathFactory, model_dirs: dict[str, Path]) -> Iterator[RuntimeProcess]:
    yield from _serve_session(tmp_path_factory, model_dirs["conv"], "conv")


@pytest.fixture(scope="session")
def two_io_server(tmp_path_factory: pytest.TempPathFactory, model_dirs: dict[str, Path]) -> Iterator[RuntimeProcess]:
    yield from _serve_session(tmp_path_factory, model_dirs["two_io"], "two_io")


def _build_go_tool(name: str) -> str:
    if shutil.which("go") is None and not os.environ.get("SKIFF_E2E_REQUIRED"):
        pytest.skip(f"go is not on PATH, so {name} cannot be built; `make test` (CI) has Go and runs this")
    script = Path(__file__).resolve().parents[2] / "scripts" / "gotool.sh"
    return subprocess.run(["bash", str(script), name], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="session")
def go_tool() -> Callable[[str], str]:
    """Builds a Go tool from the Go module proxy by scripts/gotool.sh (cached after the first build), or skips."""
    return _build_go_tool
