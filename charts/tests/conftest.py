"""Fixtures for the packaging tests (the chart, the install bundle, the images, skaffold.yaml): helm and the
skaffold schema. Without helm these tests skip, saying what to run; with SKIFF_E2E_REQUIRED=1 (`make test`, CI)
they fail instead, so a skip never stands in for a pass."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from devtools.helm import HELM_HINT, Helm, helm_binary
from devtools.vendor import SKAFFOLD_SCHEMA


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
    """skaffold's v4beta14 JSON schema, committed under third_party/ (see devtools/vendor.py)."""
    return SKAFFOLD_SCHEMA
