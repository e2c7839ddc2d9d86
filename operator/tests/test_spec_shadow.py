"""spec.rollout.shadow: parsed into frozen values with the CRD's defaults and bounds; what the CRD's schema or rules
refuse the parser refuses too, with the field and the bound in the message; the allowed neighbour passes both."""

from __future__ import annotations

from typing import Any

import pytest

from skiff_operator.spec import SpecError, parse_spec
from skiff_operator.spec import shadow as shadow_module
from skiff_operator.spec.shadow import CompareMode, Comparison, Shadow
from tests.conftest import crd_schema
from tests.fakes import defaulted
from tests.test_crd import cel_failures, schema_errors

VERSIONS = [{"name": "v1", "modelUri": "pvc://m/1"}, {"name": "v2", "modelUri": "pvc://m/2"}]
TRAFFIC = [{"version": "v1", "percent": 100}, {"version": "v2", "percent": 0}]


def body_with(shadow: Any) -> dict[str, Any]:
    rollout = {"candidate": "v2", "steps": [{"weight": 10}], "shadow": shadow}
    spec = {"versions": VERSIONS, "traffic": TRAFFIC, "rollout": rollout}
    return {"apiVersion": "skiff.dev/v1alpha1", "kind": "InferenceModel", "metadata": {"name": "m"}, "spec": spec}


def parsed(shadow: Any) -> Shadow | None:
    return parse_spec(defaulted(body_with(shadow))["spec"]).rollout.shadow  # type: ignore[union-attr]


def test_no_shadow_parses_to_none() -> None:
    spec = body_with(None)["spec"]
    del spec["rollout"]["shadow"]
    assert parse_spec(spec).rollout.shadow is None  # type: ignore[union-attr]


def test_an_empty_shadow_gets_the_documented_defaults_from_the_crd_and_the_parser_alike() -> None:
    assert parsed({}) == Shadow()
    assert parse_spec(body_with({})["spec"]).rollout.shadow == Shadow()  # type: ignore[union-attr]  # no CRD defaults
    assert Shadow() == Shadow(0.1, 64, 100, 0.99, Comparison(CompareMode.TOLERANCE, 1e-5, 1e-4, 1), ())


def test_the_crd_bounds_are_the_parsers() -> None:
    shadow = crd_schema()["properties"]["spec"]["properties"]["rollout"]["properties"]["shadow"]["properties"]
    assert shadow["queueSize"]["maximum"] == shadow_module.MAX_QUEUE_SIZE
    assert shadow["minSamples"]["maximum"] == shadow_module.MAX_MIN_SAMPLES
    assert shadow["outputs"]["maxItems"] == shadow_module.MAX_OUTPUTS
    assert shadow["compare"]["properties"]["topK"]["maximum"] == shadow_module.MAX_TOP_K
    assert (shadow["ratio"]["default"], shadow["minAgreement"]["default"]) == (0.1, 0.99)


def test_outputs_are_compared_by_their_own_entry_else_by_compare() -> None:
    shadow = parsed({"compare": {"mode": "Exact"},
                     "outputs": [{"name": "probs", "atol": 0.01, "rtol": 0}, {"name": "label", "mode": "Argmax",
                                                                             "topK": 3}]})  # fmt: skip
    assert shadow is not None
    assert shadow.comparison("probs") == Comparison(CompareMode.TOLERANCE, 0.01, 0.0, 1)
    assert shadow.comparison("label") == Comparison(CompareMode.ARGMAX, 1e-5, 1e-4, 3)
    assert shadow.comparison("other") == Comparison(CompareMode.EXACT)


@pytest.mark.parametrize(
    ("shadow", "allowed", "message"),
    [
        ({"ratio": 0.0}, {"ratio": 0.001}, "spec.rollout.shadow.ratio must be above 0 and at most 1 (not 0.0)"),
        ({"ratio": 1.5}, {"ratio": 1}, "spec.rollout.shadow.ratio must be above 0 and at most 1 (not 1.5)"),
        ({"queueSize": 0}, {"queueSize": 1}, "spec.rollout.shadow.queueSize must be 1 to 1024 (not 0)"),
        ({"queueSize": 1025}, {"queueSize": 1024}, "spec.rollout.shadow.queueSize must be 1 to 1024 (not 1025)"),
        ({"minSamples": 0}, {"minSamples": 1}, "spec.rollout.shadow.minSamples must be 1 to 1000000 (not 0)"),
        ({"minAgreement": 1.01}, {"minAgreement": 1}, "spec.rollout.shadow.minAgreement must be at least 0 and at "
                                                      "most 1"),
        ({"compare": {"mode": "Close"}}, {"compare": {"mode": "Exact"}}, "spec.rollout.shadow.compare.mode must be "
                                                                         "one of Exact, Tolerance, Argmax"),
        ({"compare": {"atol": -1}}, {"compare": {"atol": 0}}, "spec.rollout.shadow.compare.atol must be at least 0"),
        ({"compare": {"topK": 5}}, {"compare": {"topK": 5, "mode": "Argmax"}}, "compare.topK applies to mode "
                                                                               "Argmax only"),
        ({"outputs": [{"name": "a"}, {"name": "a", "mode": "Exact"}]}, {"outputs": [{"name": "a"}, {"name": "b"}]},
         "names 'a' twice"),
    ],
)  # fmt: skip
def test_a_bad_shadow_is_refused_by_the_crd_and_the_parser_and_its_neighbour_is_not(
    shadow: dict[str, Any], allowed: dict[str, Any], message: str
) -> None:
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_spec(body_with(shadow)["spec"])
    refused = body_with(shadow)
    assert schema_errors(refused) or cel_failures(crd_schema(), defaulted(refused)), shadow
    ok = body_with(allowed)
    assert schema_errors(ok) == []
    assert cel_failures(crd_schema(), defaulted(ok)) == []
    assert parsed(allowed) is not None
