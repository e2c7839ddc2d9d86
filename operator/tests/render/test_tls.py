"""render.tls: the SAN set from the model's Services, Secret volumes and env per mode, the config hash, and the
certificate objects (SelfSigned Secrets, cert-manager Certificate)."""

from __future__ import annotations

import base64
import datetime
from collections.abc import Callable
from typing import Any

import pytest

from skiff_operator import certs
from skiff_operator.manifests import render_all
from skiff_operator.render.deployment import CONFIG_HASH_ANNOTATION, render_deployment
from skiff_operator.render.tls import render_ca_secret, render_certificate, render_tls_secret
from skiff_operator.spec import InferenceModel, SpecError, parse_inference_model
from skiff_operator.tls import ca_dns_subtrees, tls_dns_names
from tests.conftest import first_plan

Body = Callable[..., dict[str, Any]]
NOW = datetime.datetime(2026, 5, 1, 12, 0, tzinfo=datetime.UTC)
TLS_ITEMS = [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}]  # never the whole Secret
TWO_VERSIONS = {
    "versions": [{"name": "v1", "modelUri": "pvc://models/a"}, {"name": "v2", "modelUri": "pvc://models/b"}],
    "traffic": [{"version": "v1", "percent": 90}, {"version": "v2", "percent": 10}],
}


def model(body: dict[str, Any]) -> InferenceModel:
    return parse_inference_model(body)


def deployment(body: dict[str, Any]) -> dict[str, Any]:
    parsed = model(body)
    return render_deployment(parsed, parsed.spec.versions[0])


def container(body: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = deployment(body)["spec"]["template"]["spec"]["containers"][0]
    return found


def env(body: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container(body)["env"]}


def config_hash(body: dict[str, Any]) -> str:
    return str(deployment(body)["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION])


def test_san_set_covers_every_service_the_model_renders(make_body: Body) -> None:
    parsed = model(make_body(name="bert", namespace="nlp", **TWO_VERSIONS))
    services = [m["metadata"]["name"] for m in render_all(first_plan(parsed)) if m["kind"] == "Service"]
    assert sorted(services) == ["bert", "bert-v1", "bert-v2"]
    names = tls_dns_names(parsed)
    for service in services:
        for name in (f"{service}.nlp.svc", f"{service}.nlp.svc.cluster.local"):
            assert name in names
    assert {"bert", "bert.nlp"} <= set(names)  # the model Service's short forms; the versions' are left out
    assert len(names) == 2 * len(services) + 2
    assert all(certs.within_dns_subtrees(name, ca_dns_subtrees(parsed)) for name in names)
    assert names[0] == "bert"  # the model Service first: it becomes the certificate's subject


def test_san_set_follows_the_versions(make_body: Body) -> None:
    one = tls_dns_names(model(make_body(name="bert")))
    two = tls_dns_names(model(make_body(name="bert", **TWO_VERSIONS)))
    assert set(two) - set(one) == {"bert-v2.ml.svc", "bert-v2.ml.svc.cluster.local"}


def test_disabled_mounts_nothing_and_sets_no_tls_env(make_body: Body) -> None:
    body = make_body()
    assert [v["name"] for v in deployment(body)["spec"]["template"]["spec"]["volumes"]] == ["model", "tmp"]
    assert not any(name.startswith("SKIFF_TLS") for name in env(body))
    assert "skiff.dev/tls-mode" not in deployment(body)["spec"]["template"]["metadata"]["annotations"]


@pytest.mark.parametrize(
    ("tls", "secret"),
    [
        ({"mode": "SelfSigned"}, "demo-tls"),
        ({"mode": "CertManager", "issuerRef": {"name": "ca", "kind": "ClusterIssuer"}}, "demo-tls"),
        ({"mode": "Secret", "secretName": "my-cert"}, "my-cert"),
    ],
)
def test_tls_secret_is_mounted_read_only_and_named_in_env(make_body: Body, tls: dict[str, Any], secret: str) -> None:
    body = make_body(tls=tls)
    volumes = deployment(body)["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tls", "secret": {"secretName": secret, "defaultMode": 0o440, "items": TLS_ITEMS}} in volumes
    assert {"name": "tls", "mountPath": "/etc/skiff/tls", "readOnly": True} in container(body)["volumeMounts"]
    variables = env(body)
    assert variables["SKIFF_TLS_CERT_FILE"] == "/etc/skiff/tls/tls.crt"
    assert variables["SKIFF_TLS_KEY_FILE"] == "/etc/skiff/tls/tls.key"
    assert "SKIFF_TLS_CLIENT_CA_FILE" not in variables
    # The kubelet's probes still go to the plaintext health port.
    assert container(body)["readinessProbe"]["grpc"]["port"] == 8002


def test_mutual_tls_mounts_the_client_ca(make_body: Body) -> None:
    body = make_body(tls={"mode": "SelfSigned", "clientCASecretName": "clients"})
    volumes = deployment(body)["spec"]["template"]["spec"]["volumes"]
    assert {
        "name": "client-ca",
        "secret": {"secretName": "clients", "defaultMode": 0o440, "items": [{"key": "ca.crt", "path": "ca.crt"}]},
    } in volumes
    mounts = container(body)["volumeMounts"]
    assert {"name": "client-ca", "mountPath": "/etc/skiff/client-ca", "readOnly": True} in mounts
    assert env(body)["SKIFF_TLS_CLIENT_CA_FILE"] == "/etc/skiff/client-ca/ca.crt"


def test_tls_keeps_pod_security_restricted(make_body: Body) -> None:
    pod = deployment(make_body(tls={"mode": "SelfSigned", "clientCASecretName": "c"}))["spec"]["template"]["spec"]
    allowed = {"persistentVolumeClaim", "emptyDir", "secret"}  # restricted allows these volume types
    assert all(set(volume) - {"name"} <= allowed for volume in pod["volumes"])
    security = pod["containers"][0]["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["runAsNonRoot"] is True


def test_config_hash_changes_with_the_mode_not_with_the_certificate(make_body: Body) -> None:
    disabled = config_hash(make_body())
    self_signed = config_hash(make_body(tls={"mode": "SelfSigned"}))
    cert_manager = config_hash(make_body(tls={"mode": "CertManager", "issuerRef": {"name": "ca"}}))
    user_secret = config_hash(make_body(tls={"mode": "Secret", "secretName": "x"}))
    # SelfSigned and CertManager mount the same Secret name: only the mode annotation tells them apart.
    assert len({disabled, self_signed, cert_manager, user_secret}) == 4
    # Nothing about the certificate itself is rendered: the same spec renders the same hash, whatever the Secret
    # holds (the runtime reloads renewed files).
    assert config_hash(make_body(tls={"mode": "SelfSigned"})) == self_signed


def test_disabled_hash_is_what_it_was_before_tls() -> None:
    from skiff_operator.render.deployment import config_hash as compute

    assert compute({"a": "b"}, {"x": 1}) == compute({"a": "b"}, {"x": 1}, {})


def test_self_signed_secrets_are_owned_and_typed(make_body: Body) -> None:
    parsed = model(make_body(name="bert", tls={"mode": "SelfSigned"}))
    ca = certs.issue_ca("test CA", NOW)
    server = certs.issue_server_certificate(ca, tls_dns_names(parsed), NOW)
    ca_secret = render_ca_secret(parsed, certs.CAChain(ca).secret_data())
    tls_secret = render_tls_secret(parsed, server, ca.cert_pem)
    assert (ca_secret["metadata"]["name"], ca_secret["type"]) == ("bert-tls-ca", "Opaque")
    assert (tls_secret["metadata"]["name"], tls_secret["type"]) == ("bert-tls", "kubernetes.io/tls")
    assert sorted(ca_secret["data"]) == ["ca.crt", "ca.key"]
    assert sorted(tls_secret["data"]) == ["ca.crt", "tls.crt", "tls.key"]
    assert base64.b64decode(tls_secret["data"]["tls.crt"]) == server.cert_pem
    for secret in (ca_secret, tls_secret):
        (owner,) = secret["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("InferenceModel", "bert", True)
        assert secret["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "skiff-operator"


def test_certificate_asks_cert_manager_for_the_san_set(make_body: Body) -> None:
    issuer = {"name": "corp", "kind": "ClusterIssuer"}
    parsed = model(make_body(name="bert", tls={"mode": "CertManager", "issuerRef": issuer}))
    certificate = render_certificate(parsed, tls_dns_names(parsed))
    assert certificate["apiVersion"] == "cert-manager.io/v1"
    assert certificate["metadata"]["name"] == "bert-tls"
    assert certificate["spec"]["secretName"] == "bert-tls"
    assert certificate["spec"]["dnsNames"] == tls_dns_names(parsed)
    assert certificate["spec"]["issuerRef"] == {"name": "corp", "kind": "ClusterIssuer", "group": "cert-manager.io"}


@pytest.mark.parametrize(
    "tls",
    [{"mode": "Secret"}, {"mode": "CertManager"}, {"clientCASecretName": "c"}, {"mode": "Mutual"}],
    ids=["secret-without-name", "cert-manager-without-issuer", "client-ca-without-tls", "unknown-mode"],
)
def test_parser_rejects_what_the_crd_rejects(make_body: Body, tls: dict[str, Any]) -> None:
    body = make_body()
    body["spec"]["tls"] = tls  # as if the CRD's rules were older than this operator
    with pytest.raises(SpecError):
        parse_inference_model(body)


@pytest.mark.parametrize(
    "tls",
    [
        {"mode": "SelfSigned", "clientCASecretName": "clients"},
        {"mode": "Secret", "secretName": "mine"},
        {"mode": "CertManager", "issuerRef": {"name": "corp"}},
    ],
)
def test_every_secret_volume_projects_named_keys_only(make_body: Body, tls: dict[str, Any]) -> None:
    model = parse_inference_model(make_body(tls=tls))
    volumes = render_deployment(model, model.spec.versions[0])["spec"]["template"]["spec"]["volumes"]
    secrets = [v["secret"] for v in volumes if "secret" in v]
    assert secrets
    assert all(s["items"] for s in secrets)
    keys = {item["key"] for s in secrets for item in s["items"]}
    assert keys <= {"tls.crt", "tls.key", "ca.crt"}
