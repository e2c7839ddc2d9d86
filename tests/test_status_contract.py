"""The operator stores what the runtime exports: a step's baseline in `.status.rollout` holds one count per latency
bucket of the runtime's histogram, so the CRD must admit that many (the API server refuses the whole status write
otherwise, and the rollout never moves: found when the buckets went from 14 to 128)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from skiff_runtime.metrics import SECONDS_BUCKETS

CRD = Path(__file__).resolve().parents[1] / "crds" / "skiff.dev_inferencemodels.yaml"


def baseline_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    rollout = status["properties"]["rollout"]["properties"]
    found: dict[str, Any] = rollout["baseline"]["items"]["properties"]["buckets"]
    return found


def test_the_rollout_baseline_admits_every_bucket_the_runtime_exports() -> None:
    # Every finite bound and +Inf.
    assert baseline_schema()["maxProperties"] >= len(SECONDS_BUCKETS) + 1


def test_the_baseline_is_still_bounded() -> None:
    assert baseline_schema()["maxProperties"] <= 4 * (len(SECONDS_BUCKETS) + 1)
