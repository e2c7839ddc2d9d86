"""manifests.render_all is exactly what a reconcile applies, so the golden files snapshot production's output."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from skiff_operator.manifests import render_all
from skiff_operator.reconcile import reconcile
from skiff_operator.spec import parse_inference_model
from tests.conftest import FIRST_PASS, OPERATOR_NAMESPACE, example_paths, first_plan, stored_body, wire
from tests.fakes import TLSFakeCluster


def _comparable(manifest: dict[str, Any]) -> dict[str, Any]:
    """Secrets carry keys issued on each call: compare their metadata, type and key names."""
    if manifest["kind"] != "Secret":
        return manifest
    return {**manifest, "data": sorted(manifest["data"])}


EXAMPLES = {path.stem: yaml.safe_load(path.read_text()) for path in example_paths()}


@pytest.mark.parametrize("example", sorted(EXAMPLES))
async def test_a_first_reconcile_applies_exactly_render_all_of_its_plan(example: str) -> None:
    body = stored_body(EXAMPLES[example])
    model = parse_inference_model(body)
    cluster = TLSFakeCluster()
    cluster.claims = {v.claim for v in model.spec.versions if v.claim is not None}
    cluster.operator_namespace = OPERATOR_NAMESPACE
    outcome = await reconcile(body, cluster, FIRST_PASS)
    rendered = render_all(first_plan(model))
    assert outcome.applied == tuple(f"{m['kind']}/{m['metadata']['name']}" for m in rendered)
    stored = [cluster.objects[(m["kind"], m["metadata"]["name"])] for m in rendered]
    assert [_comparable(m) for m in stored] == [_comparable(m) for m in rendered]


async def test_a_held_plan_renders_only_what_tls_writes(make_body: Any) -> None:
    body = make_body(tls={"mode": "SelfSigned"}, auth={"tokenSecretName": "missing"})
    outcome = await reconcile(body, TLSFakeCluster(), FIRST_PASS)
    assert outcome.applied == ("Secret/demo-tls-ca", "Secret/demo-tls")  # the auth Secret holds the rest
    assert wire(outcome.status)["conditions"][0]["reason"] == "AuthSecretMissing"
