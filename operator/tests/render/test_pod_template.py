"""render.pod_template: spec.podTemplate merged under the operator's pod, and every displaced field named."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from skiff_operator.render.deployment import CONFIG_HASH_ANNOTATION, pod_template_overrides, render_deployment
from skiff_operator.spec import NO_OPERATOR_DEFAULTS, OperatorDefaults, SpreadDomain, parse_inference_model

Body = Callable[..., dict[str, Any]]

SECRET_VOLUME = {"name": "creds", "secret": {"secretName": "vault-creds"}}


def template(body: dict[str, Any], defaults: OperatorDefaults = NO_OPERATOR_DEFAULTS) -> dict[str, Any]:
    model = parse_inference_model(body, defaults)
    rendered: dict[str, Any] = render_deployment(model, model.spec.versions[0])["spec"]["template"]
    return rendered


def overrides(body: dict[str, Any]) -> tuple[str, ...]:
    return pod_template_overrides(parse_inference_model(body))


def test_an_empty_pod_template_renders_the_pod_it_always_did(make_body: Body) -> None:
    assert template(make_body(podTemplate={})) == template(make_body())
    assert overrides(make_body(podTemplate={})) == ()


def test_what_the_user_adds_reaches_the_pod(make_body: Body) -> None:
    pod = template(
        make_body(
            podTemplate={
                "serviceAccountName": "model-reader",
                "labels": {"team": "fraud"},
                "annotations": {"sidecar.istio.io/inject": "true"},
                "env": [{"name": "AWS_REGION", "value": "eu-west-1"}],
                "envFrom": [{"configMapRef": {"name": "tuning"}}],
                "volumes": [SECRET_VOLUME],
                "volumeMounts": [{"name": "creds", "mountPath": "/var/run/creds", "readOnly": True}],
                "securityContext": {"supplementalGroups": [2000]},
            }
        )
    )
    spec, runtime = pod["spec"], pod["spec"]["containers"][0]
    assert spec["serviceAccountName"] == "model-reader"
    assert spec["automountServiceAccountToken"] is False  # the operator's: a token only where a volume asks
    assert pod["metadata"]["labels"]["team"] == "fraud"
    assert pod["metadata"]["annotations"]["sidecar.istio.io/inject"] == "true"
    assert {"name": "AWS_REGION", "value": "eu-west-1"} in runtime["env"]
    assert runtime["envFrom"] == [{"configMapRef": {"name": "tuning"}}]
    assert SECRET_VOLUME in spec["volumes"]
    assert {"name": "creds", "mountPath": "/var/run/creds", "readOnly": True} in runtime["volumeMounts"]
    assert spec["securityContext"]["supplementalGroups"] == [2000]
    assert spec["securityContext"]["runAsNonRoot"] is True


def test_adding_to_the_pod_template_rolls_the_pods(make_body: Body) -> None:
    plain = template(make_body())["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]
    labelled = template(make_body(podTemplate={"annotations": {"a": "b"}}))["metadata"]["annotations"]
    assert labelled[CONFIG_HASH_ANNOTATION] != plain


@pytest.mark.parametrize(
    ("pod_template", "field"),
    [
        ({"labels": {"skiff.dev/model": "other"}}, "spec.podTemplate.labels[skiff.dev/model]"),
        ({"annotations": {CONFIG_HASH_ANNOTATION: "0"}}, f"spec.podTemplate.annotations[{CONFIG_HASH_ANNOTATION}]"),
        ({"env": [{"name": "SKIFF_MODEL_NAME", "value": "other"}]}, "spec.podTemplate.env[SKIFF_MODEL_NAME]"),
        ({"volumes": [{"name": "tmp", "emptyDir": {}}]}, "spec.podTemplate.volumes[tmp]"),
        (
            {
                "volumes": [{"name": "scratch", "emptyDir": {}}],
                "volumeMounts": [{"name": "scratch", "mountPath": "/tmp"}],
            },
            "spec.podTemplate.volumeMounts[/tmp]",
        ),
        ({"sidecars": [{"name": "runtime", "image": "busybox"}]}, "spec.podTemplate.sidecars[runtime]"),
        (
            {"sidecars": [{"name": "agent", "image": "vault", "securityContext": {"readOnlyRootFilesystem": False}}]},
            "spec.podTemplate.sidecars[agent].securityContext.readOnlyRootFilesystem",
        ),
    ],
)
def test_the_operators_field_wins_and_the_displaced_one_is_named(
    make_body: Body, pod_template: dict[str, Any], field: str
) -> None:
    body = make_body(podTemplate=pod_template)
    plain = template(make_body())
    pod = template(body)
    assert overrides(body) == (field,)
    assert (
        pod["metadata"]["labels"]
        == plain["metadata"]["labels"] | pod_template.get("labels", {}) | plain["metadata"]["labels"]
    )
    runtime, plain_runtime = pod["spec"]["containers"][0], plain["spec"]["containers"][0]
    assert runtime["env"] == plain_runtime["env"]
    assert runtime["volumeMounts"] == plain_runtime["volumeMounts"]
    assert [v for v in pod["spec"]["volumes"] if v["name"] == "tmp"] == [{"name": "tmp", "emptyDir": {}}]


def test_a_field_that_agrees_with_the_operators_is_not_reported(make_body: Body) -> None:
    assert overrides(make_body(podTemplate={"labels": {"skiff.dev/model": "demo"}})) == ()


def test_a_mount_of_a_displaced_volume_is_dropped_with_it_so_no_sidecar_reads_the_operators(make_body: Body) -> None:
    body = make_body(
        tls={"mode": "SelfSigned"},
        podTemplate={
            "volumes": [{"name": "tmp", "emptyDir": {}}],
            "sidecars": [{"name": "agent", "image": "vault", "volumeMounts": [{"name": "tmp", "mountPath": "/x"}]}],
        },
    )
    sidecar = template(body)["spec"]["containers"][1]
    assert sidecar["volumeMounts"] == []
    assert overrides(body) == ("spec.podTemplate.volumes[tmp]", "spec.podTemplate.sidecars[agent].volumeMounts[/x]")


def test_a_sidecar_runs_restricted_under_the_operators_security_context(make_body: Body) -> None:
    sidecar_spec = {
        "name": "proxy",
        "image": "envoyproxy/envoy:v1.31",
        "ports": [{"containerPort": 80}],
        "securityContext": {"runAsUser": 1337, "capabilities": {"add": ["NET_BIND_SERVICE"]}},
    }
    containers = template(make_body(podTemplate={"sidecars": [sidecar_spec]}))["spec"]["containers"]
    assert [c["name"] for c in containers] == ["runtime", "proxy"]
    context = containers[1]["securityContext"]
    assert context["runAsUser"] == 1337
    assert context["capabilities"] == {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}
    assert (context["runAsNonRoot"], context["allowPrivilegeEscalation"], context["readOnlyRootFilesystem"]) == (
        True,
        False,
        True,
    )
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}


def test_a_spread_constraint_counts_the_versions_pods_unless_it_says_otherwise(make_body: Body) -> None:
    constraint = {"maxSkew": 2, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule"}
    spec = template(make_body(podTemplate={"topologySpreadConstraints": [constraint]}))["spec"]
    assert spec["topologySpreadConstraints"] == [
        {**constraint, "labelSelector": {"matchLabels": {"skiff.dev/model": "demo", "skiff.dev/version": "v1"}}}
    ]


def test_spread_across_nodes_and_zones_spreads_each_versions_pods(make_body: Body) -> None:
    spec = template(make_body(podTemplate={"spreadAcross": ["Nodes", "Zones"]}))["spec"]
    keys = [(c["topologyKey"], c["whenUnsatisfiable"], c["maxSkew"]) for c in spec["topologySpreadConstraints"]]
    assert keys == [
        ("kubernetes.io/hostname", "ScheduleAnyway", 1),
        ("topology.kubernetes.io/zone", "ScheduleAnyway", 1),
    ]
    assert spec["topologySpreadConstraints"][0]["matchLabelKeys"] == ["pod-template-hash"]


def test_the_operators_default_spread_applies_only_where_the_model_says_nothing(make_body: Body) -> None:
    defaults = OperatorDefaults(spread_across=(SpreadDomain.ZONES,))
    spread = template(make_body(), defaults)["spec"]["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in spread] == ["topology.kubernetes.io/zone"]
    assert "topologySpreadConstraints" not in template(make_body(podTemplate={"spreadAcross": []}), defaults)["spec"]
    assert "topologySpreadConstraints" not in template(make_body())["spec"]  # off unless the operator says so


def test_the_operators_default_image_is_used_only_where_the_model_names_none(make_body: Body) -> None:
    defaults = OperatorDefaults(runtime_image="registry.local:5000/ml/skiff-runtime:0.1.0")
    assert template(make_body(), defaults)["spec"]["containers"][0]["image"] == defaults.runtime_image
    named = make_body(runtime={"image": "ghcr.io/acme/runtime:2"})
    assert template(named, defaults)["spec"]["containers"][0]["image"] == "ghcr.io/acme/runtime:2"
