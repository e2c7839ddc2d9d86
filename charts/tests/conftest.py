"""Fixtures for the packaging tests (the chart, the install bundle, the images, skaffold.yaml): helm and the
skaffold schema. Without them these tests skip, saying what to run; with SKIFF_E2E_REQUIRED=1 (`make test`, CI)
they fail instead, so a skip never stands in for a pass."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from e2e.helm import HELM_HINT, REPO, Helm, helm_binary
from e2e.vendor import skaffold_schema as find_skaffold_schema

SKAFFOLD_SCHEMA_DEFAULT = REPO.parent / "shared" / "vendor-data" / "skaffold-schema-v4beta14" / "v4beta14.json"


def missing(reason: str) -> None:
    if os.environ.get("SKIFF_E2E_REQUIRED") == "1":
        pytest.fail(reason + " (SKIFF_E2E_REQUIRED=1: these tests must run)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def helm() -> Helm:
    binary = helm_binary()
    if binary is None:
        missing(f"helm not found; run: {HELM_HINT}")
    assert binary is not None
    return Helm(binary)


@pytest.fixture(scope="session")
def skaffold_schema() -> Path:
    """$SKIFF_SKAFFOLD_SCHEMA, else shared/vendor-data/skaffold-schema-v4beta14/v4beta14.json (see e2e/vendor.py)."""
    path = find_skaffold_schema() or SKAFFOLD_SCHEMA_DEFAULT
    if not path.is_file():
        missing(f"the skaffold/v4beta14 JSON schema is not at {path}; set $SKIFF_SKAFFOLD_SCHEMA to its path")
    return path
