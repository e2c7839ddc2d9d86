"""Every example CR renders, through the function production applies from (manifests.render_all on its first
reconcile's plan), to the committed manifests in operator/tests/golden/ (SKIFF_UPDATE_GOLDEN=1 rewrites)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from skiff_operator.manifests import render_all
from skiff_operator.spec import parse_inference_model
from tests.conftest import first_plan

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parents[1]
GOLDEN_DIR = TESTS / "golden"
EXAMPLES = sorted((REPO / "manifests" / "examples").glob("*.yaml"))
FAKE_UID = "3f1c5a9e-0000-4000-8000-000000000001"


def render_example(path: Path) -> str:
    body = yaml.safe_load(path.read_text())
    body["metadata"]["uid"] = FAKE_UID
    body["metadata"]["generation"] = 1
    manifests = [_redacted(m) for m in render_all(first_plan(parse_inference_model(body)))]
    header = f"# Rendered from manifests/examples/{path.name}; regenerate with SKIFF_UPDATE_GOLDEN=1.\n"
    return header + yaml.safe_dump_all(manifests, sort_keys=False, default_flow_style=False)


def _redacted(manifest: dict[str, Any]) -> dict[str, Any]:
    """A Secret's values (keys and certificates issued at reconcile time) differ on every run: keys only."""
    if manifest["kind"] != "Secret":
        return manifest
    return {**manifest, "data": dict.fromkeys(manifest["data"], "<issued at reconcile>")}


def test_there_are_examples() -> None:
    assert {p.name for p in EXAMPLES} >= {"cpu.yaml", "gpu.yaml", "canary.yaml"}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_renders_to_golden(example: Path) -> None:
    golden = GOLDEN_DIR / example.name
    rendered = render_example(example)
    if os.environ.get("SKIFF_UPDATE_GOLDEN") == "1":
        golden.write_text(rendered)
    assert golden.exists(), f"missing {golden}; run with SKIFF_UPDATE_GOLDEN=1 to create it"
    assert rendered == golden.read_text(), f"{example.name} renders differently; review, then regenerate"


def test_every_golden_file_has_an_example() -> None:
    assert {p.name for p in GOLDEN_DIR.glob("*.yaml")} == {p.name for p in EXAMPLES}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_render_is_deterministic(example: Path) -> None:
    assert render_example(example) == render_example(example)
