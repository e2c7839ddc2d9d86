"""A Paddle predictor configured like Skiff's engine (oneDNN on, 1 math thread, IR optimisation on, intermediate
tensors kept or freed as Skiff's `--intermediate-tensors auto` decides for the model; or a GPU).

Used by the baseline servers (repeated-float gRPC, HTTP+JSON, MLServer's runtime), so every design runs the
same engine configuration. Imports only numpy and paddle: it also loads inside MLServer's own virtualenv.
"""

from __future__ import annotations

import argparse
import os
import threading
import warnings
from pathlib import Path

import numpy as np

os.environ.setdefault("GLOG_minloglevel", "2")
os.environ.setdefault("GLOG_v", "0")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import paddle
    import paddle.inference as paddle_infer


def model_files(model_dir: Path) -> tuple[Path, Path]:
    """(program, params) of a `paddle.jit.save(..., model_dir / "inference")` export (Paddle 3.x or 2.x)."""
    params = model_dir / "inference.pdiparams"
    for name in ("inference.json", "inference.pdmodel"):
        if (model_dir / name).exists():
            return model_dir / name, params
    raise FileNotFoundError(f"no inference.json or inference.pdmodel in {model_dir}")


class Predictor:
    """One predictor guarded by a lock: a Paddle predictor is not safe to run from several threads at once."""

    def __init__(self, model_dir: Path, device: str = "cpu", keep_intermediates: bool = False) -> None:
        program, params = model_files(model_dir)
        config = paddle_infer.Config(str(program), str(params))
        config.disable_glog_info()
        config.switch_ir_optim(True)
        if device.startswith("gpu"):
            config.enable_use_gpu(512, int(device.partition(":")[2] or 0))
        else:
            config.disable_gpu()
            config.set_cpu_math_library_num_threads(1)
            config.enable_mkldnn()
        # The same choice Skiff makes for this model (the bench passes it): with intermediates kept, Paddle's
        # garbage collector is off and the baselines do not pay for its freeing thread either.
        paddle.set_flags({"FLAGS_eager_delete_tensor_gb": -1.0 if keep_intermediates else 0.0})
        self._predictor = paddle_infer.create_predictor(config)
        self.input_name = self._predictor.get_input_names()[0]
        self.output_name = self._predictor.get_output_names()[0]
        self._input = self._predictor.get_input_handle(self.input_name)
        self._output = self._predictor.get_output_handle(self.output_name)
        self._lock = threading.Lock()

    def run(self, batch: np.ndarray) -> np.ndarray:
        with self._lock:
            self._input.reshape(list(batch.shape))
            self._input.copy_from_cpu(np.ascontiguousarray(batch, dtype=np.float32))
            self._predictor.run()
            return self._output.copy_to_cpu()

    def warm_up(self, shape: tuple[int, ...] = (1, 3, 224, 224), runs: int = 3) -> None:
        for _ in range(runs):
            self.run(np.zeros(shape, dtype=np.float32))


def predictor_from_command_line(description: str | None) -> tuple[Predictor, int]:
    """The baseline servers' shared command line (MODEL_DIR [--port N] [--device D]): a warmed predictor and
    the port to listen on (0 = any)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--keep-intermediates", action="store_true", help="Paddle's garbage collector off")
    args = parser.parse_args()
    predictor = Predictor(args.model_dir, args.device, args.keep_intermediates)
    predictor.warm_up()
    return predictor, int(args.port)
