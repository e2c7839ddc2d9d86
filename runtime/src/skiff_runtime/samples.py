"""Small Paddle models that tests, the demo and benchmarks export themselves (no downloads exist here).

Run as `python -m skiff_runtime.samples KIND DIR`; set FLAGS_enable_pir_api=0 in the environment to get the
legacy Paddle 2.x `.pdmodel` format instead of Paddle 3.x `inference.json`.
"""

from __future__ import annotations

import argparse
import os
import warnings
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("GLOG_minloglevel", "2")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import paddle


class ConvNet(paddle.nn.Layer):
    """A tiny image classifier: conv -> BN -> ReLU -> pool -> linear -> softmax over 10 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = paddle.nn.Conv2D(3, 8, 3, padding=1)
        self.norm = paddle.nn.BatchNorm2D(8)
        self.pool = paddle.nn.AdaptiveAvgPool2D(1)
        self.flatten = paddle.nn.Flatten()
        self.fc = paddle.nn.Linear(8, 10)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        hidden = paddle.nn.functional.relu(self.norm(self.conv(x)))
        return paddle.nn.functional.softmax(self.fc(self.flatten(self.pool(hidden))))


class ConvStack(paddle.nn.Layer):
    """The conv sample's input and output with `depth` 64-channel 3x3 convolutions between: about 5 ms a request
    on one thread of this machine (4x that while it is busy), so a Python load generator can saturate one pod
    (e2e/test_real_autoscaling.py)."""

    def __init__(self, width: int = 64, depth: int = 12) -> None:
        super().__init__()
        self.stem = paddle.nn.Conv2D(3, width, 3, padding=1)
        self.body = paddle.nn.LayerList([paddle.nn.Conv2D(width, width, 3, padding=1) for _ in range(depth)])
        self.pool = paddle.nn.AdaptiveAvgPool2D(1)
        self.fc = paddle.nn.Linear(width, 10)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        hidden = paddle.nn.functional.relu(self.stem(x))
        for conv in self.body:
            hidden = paddle.nn.functional.relu(conv(hidden))
        return paddle.nn.functional.softmax(self.fc(paddle.flatten(self.pool(hidden), 1)))


class TwoInTwoOut(paddle.nn.Layer):
    """Two inputs (FP32 features, INT64 ids) and two outputs of different dtypes (FP32 scores, INT64 sums)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = paddle.nn.Linear(4, 3)

    def forward(self, features: paddle.Tensor, ids: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]:
        scores = paddle.tanh(self.fc(features))
        totals = paddle.sum(ids, axis=1, keepdim=True) * 3 + 1
        return scores, totals


def export_conv(directory: Path, image_size: int = 32, seed: int = 7) -> Path:
    """The conv sample; another `seed` gives other weights: a version whose answers differ (shadow tests)."""
    paddle.seed(seed)
    layer = ConvNet()
    layer.eval()
    spec = [paddle.static.InputSpec([-1, 3, image_size, image_size], "float32", "image")]
    paddle.jit.save(layer, str(directory / "inference"), input_spec=spec)
    return directory


def export_conv_heavy(directory: Path) -> Path:
    paddle.seed(7)
    layer = ConvStack()
    layer.eval()
    spec = [paddle.static.InputSpec([-1, 3, 32, 32], "float32", "image")]
    paddle.jit.save(layer, str(directory / "inference"), input_spec=spec)
    return directory


def export_conv_dynamic(directory: Path) -> Path:
    """A conv net with variable height and width: inputs smaller than its 3x3 kernel make Paddle itself fail."""
    paddle.seed(5)
    layer = paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 3), paddle.nn.AdaptiveAvgPool2D(1), paddle.nn.Flatten())
    layer.eval()
    paddle.jit.save(
        layer, str(directory / "inference"), input_spec=[paddle.static.InputSpec([-1, 3, -1, -1], "float32", "image")]
    )
    return directory


def export_two_io(directory: Path) -> Path:
    paddle.seed(11)
    layer = TwoInTwoOut()
    layer.eval()
    spec = [
        paddle.static.InputSpec([-1, 4], "float32", "features"),
        paddle.static.InputSpec([-1, 2], "int64", "ids"),
    ]
    paddle.jit.save(layer, str(directory / "inference"), input_spec=spec)
    return directory


def export_conv_seed8(directory: Path) -> Path:
    """The conv sample with other weights (seed 8): same inputs and outputs, other answers."""
    return export_conv(directory, seed=8)


EXPORTERS: dict[str, Callable[[Path], Path]] = {
    "conv": export_conv,
    "conv_dynamic": export_conv_dynamic,
    "conv_heavy": export_conv_heavy,
    "conv_seed8": export_conv_seed8,
    "two_io": export_two_io,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kind", choices=sorted(EXPORTERS))
    parser.add_argument("directory", type=Path)
    args = parser.parse_args()
    args.directory.mkdir(parents=True, exist_ok=True)
    EXPORTERS[args.kind](args.directory)
    print(f"exported {args.kind} to {args.directory}: {sorted(p.name for p in args.directory.iterdir())}")


if __name__ == "__main__":
    main()
