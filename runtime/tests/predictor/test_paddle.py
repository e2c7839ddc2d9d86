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


def test_auto_keeps_intermediates_on_cpu_while_they_fit_the_budget(model_dirs) -> None:
    assert _run(model_dirs["conv"]).pop("flag") == -1.0  # ~0.5 MiB at the default --max-batch-size 32
    # The conv net computes ~131 KB per row: 10,000 rows would keep ~1.3 GB, over the 1 GiB budget.
    assert _run(model_dirs["conv"], "--max-batch-size", "10000").pop("flag") == 0.0


@pytest.mark.parametrize(
    ("mode", "device", "estimate", "keep"),
    [
        ("auto", "cpu", 100 << 20, True),
        ("auto", "cpu", (1 << 30) + 1, False),
        ("auto", "cpu", None, False),  # unknown size (e.g. a dynamic sequence length): do not gamble memory
        ("auto", "gpu:0", 100 << 20, False),
        ("keep", "cpu", None, True),
        ("keep", "gpu:0", 8 << 30, True),
        ("free", "cpu", 1, False),
    ],
)
def test_intermediate_tensor_mode_decision(mode: str, device: str, estimate: int | None, keep: bool) -> None:
    from skiff_runtime.predictor.paddle import keeps_intermediates
    from skiff_runtime.settings import parse_settings

    settings = parse_settings(["--model-dir", "/m", "--model-name", "m", "--intermediate-tensors", mode,
                               "--device", device], env={})  # fmt: skip
    assert keeps_intermediates(settings, estimate) is keep


def test_both_program_formats_estimate_the_same_intermediates(model_dirs) -> None:
    from skiff_runtime.predictor.files import find_model_files
    from skiff_runtime.predictor.paddle import intermediates_bytes, read_signature

    estimates = {}
    for kind in ("conv", "legacy"):
        files = find_model_files(model_dirs[kind], None)
        signature = read_signature(files)
        estimates[kind] = [intermediates_bytes(files, signature, batch) for batch in (1, 4)]
    (pir_1, pir_4), (legacy_1, legacy_4) = estimates["conv"], estimates["legacy"]
    assert None not in (pir_1, pir_4, legacy_1, legacy_4)
    assert pir_1 is not None
    assert pir_4 is not None
    assert legacy_4 is not None
    assert abs(pir_4 - legacy_4) < 0.01 * pir_4  # the same network exported by Paddle 3.x and 2.x
    assert 3.9 * pir_1 < pir_4 <= 4 * pir_1  # per-row tensors scale with the batch
