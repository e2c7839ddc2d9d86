"""spec.tls against a real API server: SelfSigned Secrets whose SANs cover every Service of the model (read back
and parsed from the cluster), mounted by the Deployments and renewed when a version is added; user Secrets that
are missing, incomplete or expired give a readable condition and leave the Deployment alone; CertManager without
cert-manager says what to install. (The pod contract's TLS inference is in test_pod_contract.py.)"""

from __future__ import annotations

import datetime
import json
from typing import Any

from cryptography import x509
from devtools.cluster import Kubectl, eventually
from devtools.models import inference_model, load_example, version

from e2e.harness import OperatorProcess, condition, secret_data
from skiff_operator import certs

# The pods mount the certificate and its key, never the whole Secret.
TLS_ITEMS = [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}]

# The model Service in every form; a version Service only dotted (its short forms are outside the CA's
# NameConstraints).
MODEL_SUFFIXES = ("", ".{ns}", ".{ns}.svc", ".{ns}.svc.cluster.local")
VERSION_SUFFIXES = (".{ns}.svc", ".{ns}.svc.cluster.local")


def _certificate(kube: Kubectl, name: str, namespace: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(secret_data(kube, name, namespace)["tls.crt"])


def _sans(cert: x509.Certificate) -> set[str]:
    extension = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return set(extension.get_values_for_type(x509.DNSName))


def _expected_sans(kube: Kubectl, namespace: str, model: str) -> set[str]:
    """Every name of every Service the cluster has for the model (read from the cluster, not the operator)."""
    services = [s["metadata"]["name"] for s in kube.items("services", namespace, f"skiff.dev/model={model}")]
    assert services
    assert model in services
    return {
        service + suffix.format(ns=namespace)
        for service in services
        for suffix in (MODEL_SUFFIXES if service == model else VERSION_SUFFIXES)
    }


def _ready_reason(kube: Kubectl, namespace: str, name: str, reason: str) -> dict[str, Any]:
    jsonpath = '{.status.conditions[?(@.type=="Ready")].reason}'
    kube.run("wait", f"--for=jsonpath={jsonpath}={reason}", f"inferencemodel/{name}", "-n", namespace, "--timeout=90s")
    model: dict[str, Any] = kube.get("inferencemodel", name, "-n", namespace)
    return model


def test_self_signed_secrets_cover_every_service_and_follow_a_new_version(
    kube: Kubectl, namespace: str, claims: list[str], operator: OperatorProcess
) -> None:
    body = load_example("tls", namespace)
    name = body["metadata"]["name"]
    kube.apply(body)
    kube.run("wait", "--for=condition=Ready", f"inferencemodel/{name}", "-n", namespace, "--timeout=120s")
    model = kube.get("inferencemodel", name, "-n", namespace)
    owner = {"kind": "InferenceModel", "name": name, "uid": model["metadata"]["uid"], "controller": True}

    ca_secret = kube.get("secret", f"{name}-tls-ca", "-n", namespace)
    tls_secret = kube.get("secret", f"{name}-tls", "-n", namespace)
    assert (ca_secret["type"], sorted(ca_secret["data"])) == ("Opaque", ["ca.crt", "ca.key"])
    assert (tls_secret["type"], sorted(tls_secret["data"])) == ("kubernetes.io/tls", ["ca.crt", "tls.crt", "tls.key"])
    for secret in (ca_secret, tls_secret):
        (reference,) = secret["metadata"]["ownerReferences"]
        assert {key: reference[key] for key in owner} == owner

    cert = _certificate(kube, f"{name}-tls", namespace)
    ca_pem = secret_data(kube, f"{name}-tls-ca", namespace)["ca.crt"]
    ca_cert = x509.load_pem_x509_certificate(ca_pem)
    cert.verify_directly_issued_by(ca_cert)
    constraints = ca_cert.extensions.get_extension_for_class(x509.NameConstraints)
    permitted = {tree.value for tree in constraints.value.permitted_subtrees or ()}
    assert constraints.critical
    assert permitted == {name, f"{name}.{namespace}", f"{namespace}.svc", f"{namespace}.svc.cluster.local"}
    assert _sans(cert) == _expected_sans(kube, namespace, name)
    assert f"{name}-v1.{namespace}.svc.cluster.local" in _sans(cert)
    now = datetime.datetime.now(datetime.UTC)
    assert cert.not_valid_after_utc - now > datetime.timedelta(days=80)

    tls_status = model["status"]["tls"]
    assert tls_status["mode"] == "SelfSigned"
    assert tls_status["secretName"] == f"{name}-tls"
    assert tls_status["notAfter"] == cert.not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert set(tls_status["dnsNames"]) == _sans(cert)
    assert "TLS" in kube.run("get", "inferencemodel", name, "-n", namespace)
    assert "SelfSigned" in kube.run("get", "inferencemodel", name, "-n", namespace)

    pod_spec = kube.get("deployment", f"{name}-v1", "-n", namespace)["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    tls_volume = {"secretName": f"{name}-tls", "defaultMode": 0o440, "items": TLS_ITEMS}
    assert {"name": "tls", "secret": tls_volume} in pod_spec["volumes"]
    assert {"name": "tls", "mountPath": "/etc/skiff/tls", "readOnly": True} in container["volumeMounts"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["SKIFF_TLS_CERT_FILE"] == "/etc/skiff/tls/tls.crt"
    assert env["SKIFF_TLS_KEY_FILE"] == "/etc/skiff/tls/tls.key"
    config_hash = kube.get("deployment", f"{name}-v1", "-n", namespace)["spec"]["template"]["metadata"]["annotations"]

    # A second version adds a Service: the certificate is reissued for its names, by the same CA.
    patch = {
        "spec": {
            "versions": [*body["spec"]["versions"], {"name": "v2", "modelUri": "pvc://models/sample-cnn/v1"}],
            "traffic": [{"version": "v1", "percent": 100}, {"version": "v2", "percent": 0}],
        }
    }
    kube.run("patch", "inferencemodel", name, "-n", namespace, "--type=merge", "-p", json.dumps(patch))

    def renewed() -> x509.Certificate | None:
        found = _certificate(kube, f"{name}-tls", namespace)
        return found if f"{name}-v2.{namespace}.svc" in _sans(found) else None

    new_cert = eventually(renewed, timeout=60, what="a certificate with the v2 Service's names")
    eventually(lambda: kube.get_or_none("service", f"{name}-v2", namespace), timeout=30, what="the v2 Service")
    assert _sans(new_cert) == _expected_sans(kube, namespace, name)
    assert secret_data(kube, f"{name}-tls-ca", namespace)["ca.crt"] == ca_pem
    new_cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
    events = kube.run("get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}")
    assert "CertificateIssued" in events
    assert "CertificateRenewed" in events
    # Renewal is not a rollout: v1's pod template (and its config hash) did not change.
    after = kube.get("deployment", f"{name}-v1", "-n", namespace)["spec"]["template"]["metadata"]["annotations"]
    assert after == config_hash


def _secret_mode_model(namespace: str, secret: str) -> dict[str, Any]:
    return inference_model(
        namespace,
        "own-cert",
        [version("v1", "pvc://models/sample-cnn/v1")],
        tls={"mode": "Secret", "secretName": secret},
    )


def _tls_secret(namespace: str, name: str, data: dict[str, bytes], kind: str = "kubernetes.io/tls") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": kind,
        "stringData": {key: value.decode() for key, value in data.items()},
    }


def test_bad_user_secret_yields_a_readable_condition_and_no_deployment(
    kube: Kubectl, namespace: str, claims: list[str], operator: OperatorProcess
) -> None:
    kube.apply(_secret_mode_model(namespace, "own-cert-tls"))
    model = _ready_reason(kube, namespace, "own-cert", "TLSSecretMissing")
    assert "'own-cert-tls' not found" in condition(model, "Ready")["message"]

    now = datetime.datetime.now(datetime.UTC)
    ca = certs.issue_ca("e2e user CA", now - datetime.timedelta(days=30))
    names = certs.service_dns_names("own-cert", ["own-cert-v1"], namespace)
    expired = certs.issue_server_certificate(ca, names, now - datetime.timedelta(days=2), datetime.timedelta(days=1))
    # An Opaque Secret may lack tls.key (a kubernetes.io/tls one may not: the API server requires both keys).
    kube.apply(_tls_secret(namespace, "own-cert-tls", {"tls.crt": expired.cert_pem}, kind="Opaque"))
    model = _ready_reason(kube, namespace, "own-cert", "TLSSecretInvalid")
    assert "missing key 'tls.key'" in condition(model, "Ready")["message"]

    kube.run("delete", "secret", "own-cert-tls", "-n", namespace)
    kube.apply(_tls_secret(namespace, "own-cert-tls", {"tls.crt": expired.cert_pem, "tls.key": expired.key_pem}))

    def says_expired() -> str | None:
        found = kube.get("inferencemodel", "own-cert", "-n", namespace)
        message = condition(found, "Ready")["message"]
        return message if "certificate expired at" in message else None

    expired_message = eventually(says_expired, timeout=60, what="the condition to name the expiry")
    expired_at = x509.load_pem_x509_certificate(expired.cert_pem).not_valid_after_utc.isoformat()
    assert expired_at in expired_message
    model = kube.get("inferencemodel", "own-cert", "-n", namespace)
    assert condition(model, "Degraded")["status"] == "True"
    assert kube.get_or_none("deployment", "own-cert-v1", namespace) is None
    # No key material anywhere the user (or a log collector) reads.
    events = kube.run("get", "events", "-n", namespace, "-o", "json")
    key_line = expired.key_pem.decode().splitlines()[1]
    for text in (json.dumps(model["status"]), events, operator.log()):
        assert "PRIVATE KEY" not in text
        assert key_line not in text

    # A good Secret: the Deployment appears, mounting it, and the model becomes ready.
    good = certs.issue_server_certificate(ca, names, now)
    kube.apply(_tls_secret(namespace, "own-cert-tls", {"tls.crt": good.cert_pem, "tls.key": good.key_pem}))
    kube.run("wait", "--for=condition=Ready", "inferencemodel/own-cert", "-n", namespace, "--timeout=120s")
    pod_spec = kube.get("deployment", "own-cert-v1", "-n", namespace)["spec"]["template"]["spec"]
    tls_volume = {"secretName": "own-cert-tls", "defaultMode": 0o440, "items": TLS_ITEMS}
    assert {"name": "tls", "secret": tls_volume} in pod_spec["volumes"]
    status = kube.get("inferencemodel", "own-cert", "-n", namespace)["status"]["tls"]
    assert status["notAfter"] == good_not_after(good)


def good_not_after(pair: certs.KeyPair) -> str:
    return x509.load_pem_x509_certificate(pair.cert_pem).not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_cert_manager_mode_without_cert_manager_says_what_to_install(
    kube: Kubectl, namespace: str, claims: list[str], operator: OperatorProcess
) -> None:
    body = _secret_mode_model(namespace, "unused")
    body["metadata"]["name"] = "cm"
    body["spec"]["tls"] = {"mode": "CertManager", "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}
    kube.apply(body)
    model = _ready_reason(kube, namespace, "cm", "CertManagerNotInstalled")
    message = condition(model, "Ready")["message"]
    assert "certificates.cert-manager.io" in message
    assert "install cert-manager" in message
    assert kube.get_or_none("deployment", "cm-v1", namespace) is None
