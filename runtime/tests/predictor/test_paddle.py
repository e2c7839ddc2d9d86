"""The Paddle engine's intermediate-tensor mode: keeping buffers between runs changes speed, never results.

Paddle's garbage-collector flag is process-wide, so each mode runs in its own interpreter.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.paddle

# Batch sizes that grow, shrink and grow again: a kept buffer is reused at another size on every step.
BATCHES = [4, 1, 3, 1, 8, 2]

SCRIPT = """
import json, sys
from pathlib import Path
import numpy as np, paddle
from skiff_runtime.predictor.paddle import PaddleEngine
from skiff_runtime.settings import parse_settings
settings = parse_settings(["--model-dir", sys.argv[1], "--model-name", "m", *sys.argv[3:]], env={})
engine = PaddleEngine(settings)
batches = json.loads(sys.argv[2])
name = engine.signature.inputs[0].name
outputs = {}
for i, batch in enumerate(batches):
    image = np.random.default_rng(i).standard_normal((batch, 3, 32, 32), dtype=np.float32)
    outputs[f"run{i}"] = next(iter(engine.run({name: image}).values()))
flag = "FLAGS_eager_delete_tensor_gb"
np.savez(sys.stdout.buffer, flag=np.float64(paddle.get_flags([flag])[flag]), **outputs)
"""


def _run(model_dir: Path, *args: str) -> dict[str, np.ndarray]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(model_dir), json.dumps(BATCHES), *args], capture_output=True, check=False
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    with np.load(io.BytesIO(done.stdout)) as data:
        return {key: data[key] for key in data.files}


def test_kept_and_freed_intermediates_give_identical_outputs_at_every_batch_size(model_dirs) -> None:
    kept = _run(model_dirs["conv"], "--intermediate-tensors", "keep")
    freed = _run(model_dirs["conv"], "--intermediate-tensors", "free")
    assert kept.pop("flag") == -1.0  # garbage collector off: buffers stay with their variables
    assert freed.pop("flag") == 0.0  # Paddle's default: free after the last use
    assert [kept[f"run{i}"].shape[0] for i in range(len(BATCHES))] == BATCHES
    for key, value in kept.items():
        np.testing.assert_array_equal(value, freed[key], err_msg=key)


def test_auto_keeps_intermediates_on_cpu(model_dirs) -> None:
    assert _run(model_dirs["conv"]).pop("flag") == -1.0
