"""Exports the benchmark models with `paddle.jit.save`: random weights, eval mode, input `x` [-1,3,224,224] FP32.

`python -m bench.export_models DIR` writes DIR/<model>/inference.{json,pdiparams} for each model that is not
there yet and prints what it did.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path

MODELS = ("mobilenet_v3_small", "resnet50")


def export(name: str, directory: Path) -> None:
    os.environ.setdefault("GLOG_minloglevel", "2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import paddle

    paddle.seed(0)
    layer = getattr(paddle.vision.models, name)(pretrained=False)
    layer.eval()
    spec = [paddle.static.InputSpec([-1, 3, 224, 224], "float32", "x")]
    paddle.jit.save(layer, str(directory / "inference"), input_spec=spec)


def exported(directory: Path) -> bool:
    return (directory / "inference.pdiparams").exists() and any(
        (directory / f"inference.{ext}").exists() for ext in ("json", "pdmodel")
    )


def main() -> None:
    root = Path(sys.argv[1])
    for name in sys.argv[2:] or MODELS:
        directory = root / name
        if exported(directory):
            print(f"{name}: cached in {directory}", flush=True)
            continue
        directory.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        export(name, directory)
        print(f"{name}: exported to {directory} in {time.monotonic() - started:.1f}s", flush=True)


if __name__ == "__main__":
    main()
