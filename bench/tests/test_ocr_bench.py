"""bench.ocr: the report and its targets on made-up rows, both wire formats, and one `--quick` run of every server.

The quick run (markers slow, paddle, server) renders the English image, times the in-process pipeline, starts
Skiff's `serve --task ocr` and the PaddleX-style Triton server (its own venv under .cache/bench, built on first
use) for real, one client each, and checks that both read the floor's text with finite numbers; it asserts no
speed (the benchmark does that, not tests).
"""

from __future__ import annotations

import base64
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.ocr.run import FLOOR, SKIFF, render, targets
from bench.ocr.serving import PADDLEX_WIRE, SKIFF_WIRE, paddlex_document, paddlex_texts

ROOT = Path(__file__).resolve().parents[2]
PADDLEX = "PaddleX-style Triton, 1 instance (as shipped)"


def _row(server: str, clients: int, throughput: float, p50: float, image: str = "id-card") -> dict:
    return {"image": image, "server": server, "clients": clients, "throughput": throughput, "p50_ms": p50,
            "p99_ms": p50 * 2, "requests": 10, "errors": {}, "same_text": True, "load1": 1.0}  # fmt: skip


def test_targets_compare_skiff_at_8_clients_with_each_paddlex_server_and_at_1_client_with_the_floor() -> None:
    rows = [_row(FLOOR, 1, 2.0, 500.0), _row(SKIFF, 1, 1.8, 600.0) | {"floor_p50_ms": 400.0},
            _row(SKIFF, 8, 5.0, 1600.0),
            _row(PADDLEX, 8, 2.0, 4000.0), _row("PaddleX-style Triton, 2 instances", 8, 3.0, 2600.0)]  # fmt: skip
    verdicts = {t.name: (t.measured, t.met) for t in targets(rows)}
    assert verdicts[f"id-card, 8 clients: Skiff images/s / {PADDLEX}"] == (pytest.approx(2.5), True)
    assert verdicts["id-card, 8 clients: Skiff images/s / PaddleX-style Triton, 2 instances"] == (
        pytest.approx(5 / 3), False,
    )  # fmt: skip
    # The floor timed beside Skiff's cells, not the first in-process row: 600 / 400.
    assert verdicts["id-card, 1 client: Skiff p50 / in-process p50 (floor beside)"] == (pytest.approx(1.5), False)


def test_a_failed_cell_leaves_its_target_unmeasured_and_is_listed() -> None:
    failed = {"image": "id-card", "server": PADDLEX, "clients": 8, "same_text": True, "failed": "client failed: x"}
    rows = [_row(FLOOR, 1, 2.0, 500.0), _row(SKIFF, 1, 1.0, 1000.0), _row(SKIFF, 8, 5.0, 1600.0), failed]
    verdicts = {t.name: (t.measured, t.met) for t in targets(rows)}
    assert verdicts[f"id-card, 8 clients: Skiff images/s / {PADDLEX}"][1] is None
    # No floor beside (an older run): the first in-process row.
    assert verdicts["id-card, 1 client: Skiff p50 / in-process p50 (floor beside)"] == (pytest.approx(2.0), False)
    results = {"command": "python -m bench.ocr", "started": "now", "load_before": [1.0, 2.0, 3.0],
               "settings": {"device": "cpu", "seconds": 10, "warmup_s": 3}, "rows": rows,
               "failures": [f"{PADDLEX} / id-card c=8: client failed: x"]}  # fmt: skip
    text = render(results)
    assert f"| id-card | {PADDLEX} | 8 | — | — | — |  | — | yes | — |" in text
    assert "| id-card | Skiff (serve --task ocr) | 8 | 5.00 | 1,600.0 | 3,200.0 |  | 0 | yes | 1.0 |" in text
    assert f"- {PADDLEX} / id-card c=8: client failed: x" in text
    assert "load average (1/5/15 min) before 1.00 / 2.00 / 3.00" in text


def test_paddlex_wire_is_base64_json_in_and_paddlex_envelope_out() -> None:
    document = json.loads(paddlex_document(b"\x89PNG..."))
    assert document == {"file": base64.b64encode(b"\x89PNG...").decode(), "fileType": 1}
    answer = {"errorCode": 0, "result": {"ocrResults": [{"prunedResult": {"rec_texts": ["姓名张伟", "b"]}}]}}
    output = np.array([[json.dumps(answer).encode()]], dtype=np.object_)
    assert paddlex_texts(output) == ["姓名张伟", "b"]
    refused = np.array([[json.dumps({"errorCode": 422, "errorMsg": "Input file is invalid"}).encode()]], dtype=object)
    with pytest.raises(RuntimeError, match="answered 422: Input file is invalid"):
        paddlex_texts(refused)
    assert PADDLEX_WIRE.shape == (1, 1)  # max_batch_size 1 adds the batch axis
    assert SKIFF_WIRE.shape == (1,)
    assert SKIFF_WIRE.texts(np.array(["姓名张伟".encode()], dtype=object)) == ["姓名张伟"]


@pytest.mark.slow
@pytest.mark.paddle
@pytest.mark.server
@pytest.mark.timeout(900)  # the first run builds the PaddleX-style server's venv (about a minute, once)
def test_quick_run_reads_the_floors_text_on_every_server_with_finite_numbers(tmp_path: Path) -> None:
    cache = ROOT / ".cache" / "bench"  # the venv is reused between runs
    out = tmp_path / "ocr.md"
    cmd = [sys.executable, "-m", "bench.ocr", "--quick", "--servers", "skiff,paddlex", "--cache-dir", str(cache),
           "--output", str(out)]  # fmt: skip
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((cache / "ocr-quick.json").read_text())
    servers = [row["server"] for row in report["rows"]]
    assert servers == [FLOOR, "skiff task (in process)", SKIFF, PADDLEX]
    for row in report["rows"]:
        assert row["same_text"], row
        assert row["throughput"] > 0, row
        assert math.isfinite(row["p50_ms"]), row
        assert not row["errors"], row
    texts = report["texts"]["english"]  # what every server had to read; the floor drops some spaces
    assert len(texts) == 3
    assert texts[0] == "The quick brown fox jumps over"
    assert "english, 1 client: Skiff p50 / in-process p50 (floor beside)" in out.read_text()
    assert all(row["floor_p50_ms"] > 0 for row in report["rows"] if row["server"] in (SKIFF, PADDLEX))
