"""A real Jaeger 1.76.0 for the tracing e2e test (built from its Go module by devtools/jaeger-go/build.sh): in-memory
storage, an OTLP/gRPC receiver and the query API on 127.0.0.1 with free ports, and the query API's traces."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devtools.cluster import REPO, free_port, start_http_service, terminate

BUILD_SCRIPT = REPO / "devtools" / "jaeger-go" / "build.sh"
INSTALL_HINT = "bash devtools/jaeger-go/build.sh  (cold: 5m45s of CPU, 31 min measured on the busy 2-core machine)"


def jaeger_binary() -> str | None:
    """$SKIFF_JAEGER, else the one build.sh made; None when it is not built yet."""
    if os.environ.get("SKIFF_JAEGER"):
        return os.environ["SKIFF_JAEGER"]
    done = subprocess.run(["bash", str(BUILD_SCRIPT), "--path"], capture_output=True, text=True, check=True)
    path = Path(done.stdout.strip())
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


def jaeger_config(otlp_port: int, query_port: int, query_grpc_port: int, health_port: int) -> dict[str, Any]:
    """Jaeger v2's all-in-one, cut to what the test reads: OTLP/gRPC in, memory storage, the HTTP query API."""
    return {
        "service": {
            "extensions": ["jaeger_storage", "jaeger_query", "healthcheckv2"],
            "pipelines": {
                "traces": {"receivers": ["otlp"], "processors": ["batch"], "exporters": ["jaeger_storage_exporter"]}
            },
            "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "info"}},
        },
        "extensions": {
            "jaeger_storage": {"backends": {"memstore": {"memory": {"max_traces": 10000}}}},
            "jaeger_query": {
                "storage": {"traces": "memstore"},
                "http": {"endpoint": f"127.0.0.1:{query_port}"},
                "grpc": {"endpoint": f"127.0.0.1:{query_grpc_port}"},
            },
            "healthcheckv2": {"use_v2": True, "http": {"endpoint": f"127.0.0.1:{health_port}"}},
        },
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{otlp_port}"}}}},
        "processors": {"batch": {"timeout": "200ms"}},
        "exporters": {"jaeger_storage_exporter": {"trace_storage": "memstore"}},
    }


class JaegerError(RuntimeError):
    pass


@dataclass
class Jaeger:
    """`jaeger` on 127.0.0.1, its config and log in `workdir`; stop() ends it."""

    workdir: Path
    binary: str
    otlp_port: int = 0
    query_port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def otlp_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.otlp_port}"

    @property
    def query_url(self) -> str:
        return f"http://127.0.0.1:{self.query_port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "jaeger.log"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.otlp_port, self.query_port = free_port(), free_port()
        config = self.workdir / "jaeger.yaml"
        config.write_text(yaml.safe_dump(jaeger_config(self.otlp_port, self.query_port, free_port(), free_port())))
        self.process = start_http_service(
            [self.binary, f"--config={config}"], self.log_path, f"{self.query_url}/api/services", "jaeger", JaegerError
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process is not None:
            terminate(self.process)
            self.process = None

    def trace(self, trace_id: str) -> dict[str, Any] | None:
        """The trace as Jaeger's query API answers it (GET /api/traces/<id>: spans, references, processes); None
        while Jaeger has none under that id."""
        try:
            with urllib.request.urlopen(f"{self.query_url}/api/traces/{trace_id}", timeout=10) as response:
                data = json.load(response).get("data") or []
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise
        return data[0] if data else None
