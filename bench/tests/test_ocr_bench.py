"""The OCR benchmark's table, from a made-up result (the timed run itself is never a unit test)."""

from __future__ import annotations

from bench.ocr.run import render
from bench.stats import summarize


def test_render_shows_one_row_per_image_and_pipeline_and_flags_differing_text() -> None:
    cell = summarize([0.1, 0.2, 0.3], 0.6).__dict__
    results = {
        "device": "cpu",
        "seconds": 1.0,
        "images": {
            "id-card": {"same_text": True, "lines": 5, "pipelines": {"in-process": cell, "skiff": cell}},
            "english": {"same_text": False, "lines": 3, "pipelines": {"in-process": cell}},
        },
    }
    table = render(results)
    assert "| id-card (5 lines) | skiff | 5.00 | 200.0 | 298.0 | yes |" in table
    assert "| english (3 lines) | in-process | 5.00 | 200.0 | 298.0 | NO |" in table
