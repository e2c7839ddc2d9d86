"""The floor: Skiff's own engine (PaddleEngine: the runtime's predictor config) called in-process, no transport.

`python -m bench.inprocess MODEL_DIR --seconds S [--device gpu:0]` prints one JSON line: sequential batch-1
latencies (s) in a tight loop and paced (a new image and PACE_S idle before each call), and batch-8 images per
second. `measure()` runs it in a fresh process (Paddle is imported there only) and returns that line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.cpus import pinning

PACE_S = 0.002


def measure(
    model_dir: Path,
    seconds: float,
    warmup_seconds: float,
    device: str = "cpu",
    python: str = sys.executable,
    max_batch_size: int = 16,
    cpus: frozenset[int] | None = None,
) -> dict[str, Any]:
    """Runs `python -m bench.inprocess` in its own process and returns what it printed. `max_batch_size` is the
    served configuration's: the engine makes the same intermediate-tensor choice as Skiff's workers; `cpus`, when
    given, are the server's cores (bench.cpus)."""
    cmd = [python, "-m", "bench.inprocess", str(model_dir), "--seconds", str(seconds),
           "--warmup-seconds", str(warmup_seconds), "--device", device,
           "--max-batch-size", str(max_batch_size)]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, preexec_fn=pinning(cpus))
    if result.returncode:
        raise RuntimeError(f"in-process engine run failed:\n{result.stderr[-3000:]}")
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def main() -> None:
    from skiff_runtime.predictor.paddle import PaddleEngine
    from skiff_runtime.settings import parse_settings

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--warmup-seconds", type=float, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-batch-size", default="16")
    args = parser.parse_args()
    settings = parse_settings(
        ["--model-dir", str(args.model_dir), "--model-name", "floor", "--device", args.device,
         "--max-batch-size", args.max_batch_size],
        env={},
    )  # fmt: skip
    engine = PaddleEngine(settings)
    name = engine.signature.inputs[0].name
    image = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    batch8 = np.random.default_rng(1).random((8, 3, 224, 224), dtype=np.float32)
    for batch in (image, batch8):
        engine.run({name: batch})
    end = time.monotonic() + args.warmup_seconds
    while time.monotonic() < end:
        engine.run({name: image})
    latencies = []
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        started = time.perf_counter()
        engine.run({name: image})
        latencies.append(time.perf_counter() - started)
    # The same engine as a served request meets it: a new image copied in before each call and a pause between
    # calls (the time a request spends in the network and the front). Not the floor; it shows how much of a
    # server's added latency is the engine itself running colder than in a tight loop.
    paced = []
    fresh = [np.random.default_rng(seed).random((1, 3, 224, 224), dtype=np.float32) for seed in range(2, 10)]
    end = time.monotonic() + max(args.seconds / 2, 1)
    while time.monotonic() < end:
        time.sleep(PACE_S)
        np.copyto(image, fresh[len(paced) % len(fresh)])
        started = time.perf_counter()
        engine.run({name: image})
        paced.append(time.perf_counter() - started)
    runs, started = 0, time.perf_counter()
    end = time.monotonic() + max(args.seconds / 2, 1)
    while time.monotonic() < end:
        engine.run({name: batch8})
        runs += 1
    batch8_ips = runs * 8 / (time.perf_counter() - started)
    print(
        json.dumps(
            {
                "latencies_s": latencies,
                "paced_latencies_s": paced,
                "pace_s": PACE_S,
                "seconds": args.seconds,
                "batch8_images_per_s": batch8_ips,
            }
        )
    )


if __name__ == "__main__":
    main()
