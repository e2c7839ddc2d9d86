"""spec: bodies a tenant shapes against the parser - names that are paths, quantities Kubernetes reads otherwise,
affinity nested past the Pod API, values of the wrong type - end in SpecError (InvalidSpec), never in a crash;
each refusal is paired with the allowed variant."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from devtools.fuzz import SPEC_MEMBER, place
from hypothesis import given, settings

from skiff_operator.manifests import render_all
from skiff_operator.observed import MetricsScrape
from skiff_operator.plan import Observed, make_plan
from skiff_operator.spec import (
    MAX_AFFINITY_DEPTH,
    MAX_WORKERS,
    InferenceModel,
    SpecError,
    parse_inference_model,
    parse_quantity,
)
from skiff_operator.tls import TLSObserved
from tests.conftest import FIRST_PASS, stored_body

Body = Callable[..., dict[str, Any]]


def rendered(model: InferenceModel) -> list[dict[str, Any]]:
    """Every manifest of the model's first reconcile (held or not)."""
    observed = Observed(TLSObserved(), scrape=MetricsScrape() if model.spec.rollout is not None else None)
    return render_all(make_plan(model, observed, FIRST_PASS))


PATH = "../../team-b/secrets/x"

# (where the name goes in spec, the allowed variant): every field that names an object or a namespace.
NAME_FIELDS: list[tuple[str, Callable[[str], dict[str, Any]]]] = [
    ("spec.tls.secretName", lambda n: {"tls": {"mode": "Secret", "secretName": n}}),
    ("spec.tls.clientCASecretName", lambda n: {"tls": {"mode": "SelfSigned", "clientCASecretName": n}}),
    ("spec.auth.tokenSecretName", lambda n: {"auth": {"tokenSecretName": n}}),
    ("spec.runtime.imagePullSecrets[]", lambda n: {"runtime": {"imagePullSecrets": [n]}}),
    ("spec.runtime.tensorrt.cacheDir.claimName", lambda n: {"runtime": {"tensorrt": {"cacheDir": {"claimName": n}}}}),
    (
        "spec.tls.issuerRef.name",
        lambda n: {"tls": {"mode": "CertManager", "issuerRef": {"name": n}}},
    ),
    ("spec.routing.gateways[].name", lambda n: {"routing": {"gateways": [{"name": n}]}}),
    ("spec.routing.gateways[].sectionName", lambda n: {"routing": {"gateways": [{"name": "g", "sectionName": n}]}}),
    ("spec.scheduling.runtimeClassName", lambda n: {"scheduling": {"runtimeClassName": n}}),
    ("spec.scheduling.priorityClassName", lambda n: {"scheduling": {"priorityClassName": n}}),
]
NAMESPACE_FIELDS: list[tuple[str, Callable[[str], dict[str, Any]]]] = [
    ("spec.routing.gateways[].namespace", lambda n: {"routing": {"gateways": [{"name": "g", "namespace": n}]}}),
    ("spec.networkPolicy.metricsNamespaces[]", lambda n: {"networkPolicy": {"metricsNamespaces": [n]}}),
]


@pytest.mark.parametrize(("where", "spec"), NAME_FIELDS, ids=[w for w, _ in NAME_FIELDS])
@pytest.mark.parametrize("bad", [PATH, "x/y", "..", "a..b", "UPPER", "x\n", "a" * 254, "-x", "x."])
def test_a_name_that_is_not_a_dns_name_is_invalid_spec(make_body: Body, where: str, spec: Any, bad: str) -> None:
    with pytest.raises(SpecError, match="must be the name of an object") as caught:
        parse_inference_model(make_body(**spec(bad)))
    assert caught.value.reason == "InvalidSpec"
    assert where in caught.value.message
    assert len(caught.value.message) < 400  # a 254-character name is cut short in the message


@pytest.mark.parametrize(("where", "spec"), NAME_FIELDS, ids=[w for w, _ in NAME_FIELDS])
@pytest.mark.parametrize("good", ["team-a-tls", "team-a.tls.v2", "a" * 253, "0"])
def test_a_dns_name_is_accepted(make_body: Body, where: str, spec: Any, good: str) -> None:
    parse_inference_model(make_body(**spec(good)))


@pytest.mark.parametrize(("where", "spec"), NAMESPACE_FIELDS, ids=[w for w, _ in NAMESPACE_FIELDS])
def test_a_namespace_field_takes_a_dns_label_only(make_body: Body, where: str, spec: Any) -> None:
    parse_inference_model(make_body(**spec("team-a")))
    for bad in ("team.a", PATH, "a" * 64):
        with pytest.raises(SpecError, match="must be a namespace name"):
            parse_inference_model(make_body(**spec(bad)))


def test_the_token_key_is_a_secret_key(make_body: Body) -> None:
    parse_inference_model(make_body(auth={"tokenSecretName": "t", "tokenKey": "tokens.txt"}))
    with pytest.raises(SpecError, match="must be a Secret key"):
        parse_inference_model(make_body(auth={"tokenSecretName": "t", "tokenKey": "a/b"}))


def test_the_claim_of_a_model_uri_is_a_dns_name(make_body: Body) -> None:
    parse_inference_model(make_body(versions=[{"name": "v1", "modelUri": "pvc://my.claim/a"}]))
    for uri in ("pvc://a..b/x", f"pvc://{'a' * 254}/x"):
        with pytest.raises(SpecError) as caught:
            parse_inference_model(make_body(versions=[{"name": "v1", "modelUri": uri}]))
        assert caught.value.reason == "InvalidModelUri"


def test_the_model_namespace_is_a_dns_label() -> None:
    body = {"metadata": {"name": "demo", "namespace": "../kube-system"}, "spec": {"versions": []}}
    with pytest.raises(SpecError, match=r"metadata\.namespace"):
        parse_inference_model(body)


# --- quantities ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2", Decimal(2)),
        ("500m", Decimal("0.5")),
        ("2k", Decimal(2000)),
        ("1.5Gi", Decimal(3 * 2**29)),
        ("1e3", Decimal(1000)),
        ("1E-3", Decimal("0.001")),
        ("+1", Decimal(1)),
        (".5", Decimal("0.5")),
        ("1.", Decimal(1)),
        ("100n", Decimal("1E-7")),
        ("3u", Decimal("0.000003")),
        ("0", Decimal(0)),
        ("8Pi", Decimal(8 * 2**50)),  # about the largest: MAX_QUANTITY is 2**63 milli-units
    ],
)
def test_quantities_parse_to_their_kubernetes_value(text: str, value: Decimal) -> None:
    assert parse_quantity(text, "resources.cpu") == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("-1", "must not be negative"),
        ("2K", "must be a quantity"),  # Kubernetes' kilo is lowercase
        ("1e1.5", "must be a quantity"),  # the CRD's old pattern took it; Kubernetes' parser does not
        ("1.5.5", "must be a quantity"),
        ("1 ", "must be a quantity"),
        ("1\n", "must be a quantity"),
        ("Gi", "must be a quantity"),
        ("1" * 65, "must be a quantity"),
        ("1e999999999", "larger than Kubernetes can hold"),
        ("10E", "larger than Kubernetes can hold"),
        ("8Ei", "larger than Kubernetes can hold"),
        ("9300000000000000", "larger than Kubernetes can hold"),
    ],
)
def test_quantities_kubernetes_cannot_hold_are_invalid_spec(text: str, message: str) -> None:
    with pytest.raises(SpecError, match=message) as caught:
        parse_quantity(text, "resources.cpu")
    assert caught.value.reason == "InvalidSpec"


def test_cpu_2k_renders_with_a_bounded_worker_count(make_body: Body) -> None:
    """The crash of every resync: `cpu: 2k` (2,000 cores) was a float() error in the renderer."""
    model = parse_inference_model(stored_body(make_body(resources={"cpu": "2k", "memory": "4e9"})))
    manifests = rendered(model)
    (deployment,) = [m for m in manifests if m["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["requests"]["cpu"] == "2k"  # rendered as written: the API server reads it alike
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SKIFF_WORKERS"] == str(MAX_WORKERS)


@pytest.mark.parametrize("cpu", ["1e400", "-2", 10**30])
def test_a_cpu_the_renderer_cannot_use_is_invalid_spec(make_body: Body, cpu: Any) -> None:
    with pytest.raises(SpecError) as caught:
        parse_inference_model(make_body(resources={"cpu": cpu}))
    assert caught.value.reason == "InvalidSpec"
    with pytest.raises(SpecError):
        parse_inference_model(make_body(versions=[{"name": "v1", "modelUri": "pvc://m", "resources": {"cpu": cpu}}]))


# --- affinity and other documents ----------------------------------------------------------------------------


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"x": value}
    return value


def test_affinity_as_deep_as_the_pod_api_allows_is_accepted(make_body: Body) -> None:
    term = {"labelSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["a"]}]},
            "topologyKey": "kubernetes.io/hostname"}  # fmt: skip
    affinity = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "podAffinityTerm": term}]}}  # fmt: skip
    model = parse_inference_model(make_body(scheduling={"affinity": affinity}))
    assert model.spec.scheduling.affinity is not None
    assert model.spec.scheduling.affinity.to_manifest() == affinity
    parse_inference_model(make_body(scheduling={"affinity": nested(MAX_AFFINITY_DEPTH)}))


@pytest.mark.parametrize("depth", [MAX_AFFINITY_DEPTH + 1, 1_500, 100_000])
def test_affinity_nested_deeper_is_invalid_spec_without_recursion(make_body: Body, depth: int) -> None:
    body = make_body()
    body["spec"]["scheduling"]["affinity"] = nested(depth)  # after make_body's defaulting, which recurses
    with pytest.raises(SpecError, match="nested deeper than the Pod API allows") as caught:
        parse_inference_model(body)
    assert caught.value.reason == "InvalidSpec"


@pytest.mark.parametrize("value", [1.5, None, True, {1: "a"}])
def test_affinity_with_values_no_pod_api_field_has_is_invalid_spec(make_body: Body, value: Any) -> None:
    with pytest.raises(SpecError):
        parse_inference_model(make_body(scheduling={"affinity": {"nodeAffinity": {"x": value}}}))


@pytest.mark.parametrize(
    "scheduling",
    [{"nodeSelector": {"a": nested(1_500)}}, {"nodeSelector": {"a": 1}}, {"tolerations": [{"key": nested(1_500)}]}],
)
def test_a_string_field_holding_a_document_is_invalid_spec(make_body: Body, scheduling: dict[str, Any]) -> None:
    """These were str()-ed: a deep document raised RecursionError, a number passed as a label value."""
    body = make_body()
    body["spec"]["scheduling"].update(scheduling)
    with pytest.raises(SpecError):
        parse_inference_model(body)
    parse_inference_model(make_body(scheduling={"nodeSelector": {"a": "b"}, "tolerations": [{"key": "k"}]}))


# --- anything at all -----------------------------------------------------------------------------------------


BASE = stored_body(
    {"metadata": {"name": "demo", "namespace": "ml"}, "spec": {"versions": [{"name": "v1", "modelUri": "pvc://m/a"}]}}
)


@settings(max_examples=200, deadline=None)
@given(member=SPEC_MEMBER)
def test_any_json_in_any_field_parses_and_renders_or_is_a_spec_error(member: tuple[str, str | None, Any]) -> None:
    """Random documents in each field (and one level down): the parser returns a model that renders, or raises
    SpecError; nothing else escapes (a TypeError or RecursionError here would be a model stuck without status)."""
    body = copy.deepcopy(BASE)  # defaulted once; the parser applies the same defaults itself
    place(body["spec"], member)
    try:
        model = parse_inference_model(body)
    except SpecError as error:
        reason = error.reason
    else:
        json.dumps(rendered(model))
        reason = None
    assert reason in {None, "InvalidSpec", "InvalidModelUri", "UnsupportedModelUri"}
