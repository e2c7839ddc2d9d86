"""This checkout's runtime against another revision's, in interleaved rounds: normal-request speed, before vs after.

`python -m bench.ab --before REV [--model mobilenet_v3_small] [--rounds 3] [--seconds 8]` takes REV's
`runtime/src` with `git archive` into a temporary directory and runs it by putting that first on PYTHONPATH (same
venv, same model files, same flags); this checkout's runtime is the "after". Each round starts "before" then
"after" (`skiff-runtime serve`, 2 workers, batching on, as `python -m bench` does) and measures each with the
bench's own closed-loop tritonclient load (bench.loadgen) at concurrency 1 and 8. Alternating in one run spreads
the shared machine's load over both sides alike, which separate `make bench` runs cannot; and the front process's
CPU time per request (user + system, from /proc) hardly depends on that load at all. The models are those
`python -m bench` exported into .cache/bench/models (`python -m bench.export_models .cache/bench/models`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

from bench import loadgen, servers
from bench.stats import percentile

ROOT = Path(__file__).resolve().parent.parent


def extract_runtime(revision: str, into: Path) -> Path:
    """REV's runtime/src under `into`; returns the directory to put on PYTHONPATH."""
    archive = subprocess.run(["git", "archive", revision, "runtime/src"], cwd=ROOT, check=True, capture_output=True)
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into / "runtime" / "src"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve(
    name: str, model_dir: Path, model: str, log: Path, pythonpath: str | None, extra: list[str] | None = None
) -> servers.ServerProcess:
    cmd = [sys.executable, "-m", "skiff_runtime", "serve", "--model-dir", str(model_dir), "--model-name", model,
           "--host", "127.0.0.1", "--grpc-port", "0", "--health-port", "0", "--metrics-port", "0",
           "--max-batch-size", "16", "--dynamic-batching", "true", "--workers", "2", *(extra or [])]  # fmt: skip
    env = {"PYTHONPATH": pythonpath} if pythonpath else {}
    return servers.ServerProcess(name, cmd, log, servers.skiff_ready, env).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n")[0])
    parser.add_argument("--before", required=True, help="git revision whose runtime is the 'before' side")
    parser.add_argument("--model", default="mobilenet_v3_small")
    parser.add_argument("--cache-dir", type=Path, default=ROOT / ".cache" / "bench")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0, help="measured window per cell (default 8)")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument(
        "--after-flag",
        action="append",
        default=[],
        help="a flag for the 'after' side only, repeatable: --after-flag=--trace-endpoint=http://127.0.0.1:4317 "
        "measures tracing on against the same checkout with --before HEAD",
    )
    args = parser.parse_args(argv)
    model_dir = args.cache_dir / "models" / args.model
    if not model_dir.is_dir():
        raise SystemExit(f"{model_dir} is missing: run `python -m bench.export_models {args.cache_dir / 'models'}`")
    results: dict[str, dict[str, list[float]]] = {side: {} for side in ("before", "after")}
    with tempfile.TemporaryDirectory(prefix="skiff-ab-") as tmp:
        sides = {"before": str(extract_runtime(args.before, Path(tmp))), "after": None}
        print(f"before = {args.before} (runtime/src via PYTHONPATH), after = this checkout; model {args.model}; "
              f"load average {' / '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)  # fmt: skip
        for round_number in range(1, args.rounds + 1):
            for side, pythonpath in sides.items():
                log = Path(tmp) / f"{side}-{round_number}.log"
                extra = args.after_flag if side == "after" else []
                server = serve(side, model_dir, args.model, log, pythonpath, extra)
                try:
                    spec = loadgen.ClientSpec("triton", server.port, args.model, "x")
                    assert server.proc is not None
                    for concurrency in (1, 8):
                        cpu_before = cpu_seconds(server.proc.pid)
                        window = loadgen.run_clients(spec, concurrency, args.warmup, args.seconds)
                        requests = window.completed * (args.warmup + args.seconds) / args.seconds  # warm-up too
                        front_ms = (cpu_seconds(server.proc.pid) - cpu_before) * 1000 / max(requests, 1)
                        ms = [v * 1000 for v in window.latencies_s]
                        cell = results[side]
                        cell.setdefault(f"p50 c={concurrency}", []).append(percentile(ms, 50))
                        cell.setdefault(f"p99 c={concurrency}", []).append(percentile(ms, 99))
                        cell.setdefault(f"req/s c={concurrency}", []).append(window.completed / window.seconds)
                        cell.setdefault(f"front CPU ms per request c={concurrency}", []).append(front_ms)
                        print(f"round {round_number} {side:6} c={concurrency}: p50 {percentile(ms, 50):.2f} ms, "
                              f"p99 {percentile(ms, 99):.2f} ms, {window.completed / window.seconds:.1f} req/s, "
                              f"front CPU {front_ms:.2f} ms/request, errors {window.errors or 0}; "
                              f"load {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
                finally:
                    server.stop()
                logged = log.read_bytes().count(b'"kind":"payload"')  # lines of --payload-log-ratio, if on
                if logged:
                    print(f"round {round_number} {side:6}: {logged} payload log lines written", flush=True)
    print("\n| measure | before (median of rounds) | after (median of rounds) | after / before |\n|---|---|---|---|")
    for key in results["before"]:
        before, after = statistics.median(results["before"][key]), statistics.median(results["after"][key])
        print(f"| {key} | {before:.2f} | {after:.2f} | {after / before:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
