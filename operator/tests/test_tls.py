"""tls (the reconcile's TLS step): SelfSigned issues once and renews only when needed (2/3 of the lifetime, SAN
set, CA), user Secrets and cert-manager give readable conditions, and no key material reaches status or Events."""

from __future__ import annotations

import base64
import copy
import datetime
import json
from collections.abc import Callable
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from skiff_operator import certs
from skiff_operator.reconcile import reconcile
from skiff_operator.spec import parse_inference_model
from skiff_operator.tls import observe_tls, plan_tls
from tests.conftest import wire
from tests.fakes import TLSFakeCluster, condition, user_secret

NOW = datetime.datetime(2026, 5, 1, 12, 0, tzinfo=datetime.UTC)
TLS_ITEMS = [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}]  # never the whole Secret
Body = Callable[..., dict[str, Any]]
SELF_SIGNED = {"mode": "SelfSigned"}
TWO_VERSIONS = {
    "versions": [{"name": "v1", "modelUri": "pvc://models/a"}, {"name": "v2", "modelUri": "pvc://models/b"}],
    "traffic": [{"version": "v1", "percent": 100}, {"version": "v2", "percent": 0}],
}


def dns_names(cert: x509.Certificate) -> set[str]:
    extension = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return set(extension.get_values_for_type(x509.DNSName))


def applied_secrets(applied: tuple[str, ...]) -> list[str]:
    return [item for item in applied if item.startswith("Secret/")]


async def test_self_signed_creates_the_ca_and_the_server_secret(make_body: Body) -> None:
    cluster = TLSFakeCluster()
    outcome = await reconcile(make_body(tls=SELF_SIGNED), cluster, NOW)
    assert applied_secrets(outcome.applied) == ["Secret/demo-tls-ca", "Secret/demo-tls"]
    assert outcome.applied[-4:-1] == ("Deployment/demo-v1", "Service/demo-v1", "Service/demo")
    assert sorted(cluster.secret("demo-tls-ca")) == ["ca.crt", "ca.key"]
    server = cluster.certificate()
    assert dns_names(server) == {"demo", "demo.ml", "demo.ml.svc", "demo.ml.svc.cluster.local"} | {
        "demo-v1.ml.svc", "demo-v1.ml.svc.cluster.local"
    }  # fmt: skip
    ca = x509.load_pem_x509_certificate(cluster.secret("demo-tls-ca")["ca.crt"])
    server.verify_directly_issued_by(ca)
    constraints = ca.extensions.get_extension_for_class(x509.NameConstraints)
    assert constraints.critical
    permitted = [tree.value for tree in constraints.value.permitted_subtrees or ()]
    assert permitted == ["demo", "demo.ml", "ml.svc", "ml.svc.cluster.local"]
    assert cluster.secret("demo-tls")["ca.crt"] == cluster.secret("demo-tls-ca")["ca.crt"]
    assert [e.reason for e in outcome.events][:2] == ["CertificateIssued", "CertificateIssued"]
    assert wire(outcome.status)["tls"] == {
        "mode": "SelfSigned",
        "secretName": "demo-tls",
        "notAfter": (NOW + certs.SERVER_LIFETIME).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "dnsNames": sorted(dns_names(server), key=list(wire(outcome.status)["tls"]["dnsNames"]).index),
    }


async def test_self_signed_is_not_reissued_on_every_reconcile(make_body: Body) -> None:
    cluster = TLSFakeCluster()
    body = make_body(tls=SELF_SIGNED)
    await reconcile(body, cluster, NOW)
    before = copy.deepcopy(cluster.objects)
    later = await reconcile(body, cluster, NOW + datetime.timedelta(days=30))
    assert applied_secrets(later.applied) == []
    assert [e.reason for e in later.events if e.reason.startswith("Certificate")] == []
    assert cluster.objects == before
    assert {"demo-tls-ca", "demo-tls"} <= set(cluster.reads)  # it did look


async def test_renewal_at_two_thirds_of_the_lifetime_keeps_the_ca_and_the_deployment(make_body: Body) -> None:
    cluster = TLSFakeCluster()
    body = make_body(tls=SELF_SIGNED)
    await reconcile(body, cluster, NOW)
    ca_before = cluster.secret("demo-tls-ca")
    serial = cluster.certificate().serial_number
    deployment = copy.deepcopy(cluster.objects[("Deployment", "demo-v1")])

    just_before = NOW + certs.SERVER_LIFETIME * 2 / 3 - datetime.timedelta(hours=1)
    assert applied_secrets((await reconcile(body, cluster, just_before)).applied) == []
    after = NOW + certs.SERVER_LIFETIME * 2 / 3 + datetime.timedelta(hours=1)
    renewed = await reconcile(body, cluster, after)

    assert applied_secrets(renewed.applied) == ["Secret/demo-tls"]  # the CA stays
    assert cluster.secret("demo-tls-ca") == ca_before
    assert cluster.certificate().serial_number != serial
    assert cluster.certificate().not_valid_after_utc > after + datetime.timedelta(days=80)
    (event,) = [e for e in renewed.events if e.reason == "CertificateRenewed"]
    assert "NearExpiry" in event.message
    # The pods are not rolled: the runtime reloads the renewed files.
    assert cluster.objects[("Deployment", "demo-v1")] == deployment


async def test_adding_a_version_renews_for_the_new_service_names(make_body: Body) -> None:
    cluster = TLSFakeCluster()
    await reconcile(make_body(tls=SELF_SIGNED), cluster, NOW)
    outcome = await reconcile(make_body(tls=SELF_SIGNED, **TWO_VERSIONS), cluster, NOW + datetime.timedelta(hours=1))
    assert applied_secrets(outcome.applied) == ["Secret/demo-tls"]
    assert {"demo-v2.ml.svc", "demo-v2.ml.svc.cluster.local"} <= dns_names(cluster.certificate())
    assert "Secret/demo-tls-ca" not in outcome.applied  # the CA's constraints cover any version
    (event,) = [e for e in outcome.events if e.reason == "CertificateRenewed"]
    assert "SANsChanged" in event.message
    assert "demo-v2.ml.svc" in event.message
    assert "demo-v2.ml.svc" in wire(outcome.status)["tls"]["dnsNames"]


async def test_a_deleted_ca_is_recreated_and_the_server_certificate_follows(make_body: Body) -> None:
    cluster = TLSFakeCluster()
    body = make_body(tls=SELF_SIGNED)
    await reconcile(body, cluster, NOW)
    del cluster.objects[("Secret", "demo-tls-ca")]
    outcome = await reconcile(body, cluster, NOW + datetime.timedelta(minutes=1))
    assert applied_secrets(outcome.applied) == ["Secret/demo-tls-ca", "Secret/demo-tls"]
    ca = x509.load_pem_x509_certificate(cluster.secret("demo-tls-ca")["ca.crt"])
    cluster.certificate().verify_directly_issued_by(ca)


async def test_a_tampered_server_secret_is_replaced(make_body: Body) -> None:
    cluster = TLSFakeCluster()
    body = make_body(tls=SELF_SIGNED)
    await reconcile(body, cluster, NOW)
    del cluster.objects[("Secret", "demo-tls")]["data"]["tls.key"]  # edited in place: still the model's
    outcome = await reconcile(body, cluster, NOW)
    assert applied_secrets(outcome.applied) == ["Secret/demo-tls"]
    assert certs.check_tls_secret(cluster.secret("demo-tls"), NOW) == []


async def test_missing_user_secret_holds_the_deployment_with_a_readable_condition(make_body: Body) -> None:
    cluster = TLSFakeCluster()
    outcome = await reconcile(make_body(tls={"mode": "Secret", "secretName": "my-cert"}), cluster, NOW)
    assert ("Deployment", "demo-v1") not in cluster.objects
    assert condition(wire(outcome.status), "Ready") == ("False", "TLSSecretMissing")
    assert condition(wire(outcome.status), "Degraded") == ("True", "TLSSecretMissing")
    message = next(c["message"] for c in wire(outcome.status)["conditions"] if c["type"] == "Ready")
    assert "'my-cert' not found in namespace ml" in message
    assert wire(outcome.status)["tls"] == {
        "mode": "Secret",
        "secretName": "my-cert",
        "notAfter": None,
        "dnsNames": None,
    }
    assert [e.reason for e in outcome.events] == ["TLSSecretMissing"]


async def test_bad_user_secrets_are_invalid_and_never_quote_the_key(make_body: Body) -> None:
    good = user_secret(NOW, datetime.timedelta(days=30))
    cases = {
        "missing key 'tls.key'": {"tls.crt": good["tls.crt"]},
        "certificate expired at": user_secret(NOW, datetime.timedelta(hours=1)),
        "'tls.crt' is not a PEM certificate": {"tls.crt": b"nonsense", "tls.key": good["tls.key"]},
    }
    for expected, data in cases.items():
        cluster = TLSFakeCluster()
        cluster.put_secret("my-cert", data)
        body = make_body(tls={"mode": "Secret", "secretName": "my-cert"})
        outcome = await reconcile(body, cluster, NOW)
        assert ("Deployment", "demo-v1") not in cluster.objects, expected
        assert condition(wire(outcome.status), "Ready") == ("False", "TLSSecretInvalid"), expected
        message = next(c["message"] for c in wire(outcome.status)["conditions"] if c["type"] == "Ready")
        assert expected in message
        assert "Secret 'my-cert'" in message
        everything = json.dumps(wire(outcome.status)) + "".join(e.message for e in outcome.events)
        key_body = good["tls.key"].decode().splitlines()[1]
        assert key_body not in everything
        assert "PRIVATE KEY" not in everything


async def test_good_user_secret_is_mounted_and_reported(make_body: Body) -> None:
    cluster = TLSFakeCluster()
    cluster.put_secret("my-cert", user_secret(NOW, datetime.timedelta(days=30)))
    outcome = await reconcile(make_body(tls={"mode": "Secret", "secretName": "my-cert"}), cluster, NOW)
    assert condition(wire(outcome.status), "Ready") == ("False", "RollingOut")
    volumes = cluster.objects[("Deployment", "demo-v1")]["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tls", "secret": {"secretName": "my-cert", "defaultMode": 0o440, "items": TLS_ITEMS}} in volumes
    assert wire(outcome.status)["tls"]["dnsNames"] == ["demo.ml.svc"]
    assert applied_secrets(outcome.applied) == []  # the user's Secret is never written


async def test_cert_manager_not_installed_says_what_to_install(make_body: Body) -> None:
    cluster = TLSFakeCluster()
    body = make_body(tls={"mode": "CertManager", "issuerRef": {"name": "corp", "kind": "ClusterIssuer"}})
    outcome = await reconcile(body, cluster, NOW)
    assert condition(wire(outcome.status), "Ready") == ("False", "CertManagerNotInstalled")
    message = next(c["message"] for c in wire(outcome.status)["conditions"] if c["type"] == "Ready")
    assert "certificates.cert-manager.io" in message
    assert "install cert-manager" in message
    assert cluster.objects == {}


async def test_cert_manager_certificate_is_applied_and_its_secret_used_once_issued(make_body: Body) -> None:
    cluster = TLSFakeCluster(crds=("certificates.cert-manager.io",))
    body = make_body(tls={"mode": "CertManager", "issuerRef": {"name": "corp"}})
    pending = await reconcile(body, cluster, NOW)
    certificate = cluster.objects[("Certificate", "demo-tls")]
    assert certificate["spec"]["issuerRef"] == {"name": "corp", "kind": "Issuer", "group": "cert-manager.io"}
    assert "demo-v1.ml.svc.cluster.local" in certificate["spec"]["dnsNames"]
    assert ("Deployment", "demo-v1") not in cluster.objects
    assert condition(wire(pending.status), "Ready") == ("False", "CertificatePending")
    assert condition(wire(pending.status), "Progressing") == ("True", "CertificatePending")
    assert condition(wire(pending.status), "Degraded") == ("False", "AsExpected")

    # cert-manager issues it (through an intermediate: ca.crt is the root, which must not matter).
    root = certs.issue_ca("root", NOW)
    intermediate = certs.issue_ca("intermediate", NOW)
    leaf = certs.issue_server_certificate(intermediate, certificate["spec"]["dnsNames"], NOW)
    chain = leaf.cert_pem + intermediate.cert_pem
    issued_by = {"cert-manager.io/certificate-name": "demo-tls"}
    cluster.put_secret(
        "demo-tls", {"tls.crt": chain, "tls.key": leaf.key_pem, "ca.crt": root.cert_pem}, annotations=issued_by
    )
    body["status"] = wire(pending.status)
    issued = await reconcile(body, cluster, NOW)
    assert ("Deployment", "demo-v1") in cluster.objects
    assert condition(wire(issued.status), "Ready") == ("False", "RollingOut")
    assert wire(issued.status)["tls"]["secretName"] == "demo-tls"


async def test_mutual_tls_needs_the_client_ca_secret(make_body: Body) -> None:
    cluster = TLSFakeCluster()
    body = make_body(tls={"mode": "SelfSigned", "clientCASecretName": "clients"})
    missing = await reconcile(body, cluster, NOW)
    assert condition(wire(missing.status), "Ready") == ("False", "TLSSecretMissing")
    assert "clientCASecretName" in next(c["message"] for c in wire(missing.status)["conditions"])
    cluster.put_secret("clients", {"ca.crt": b"not pem"})
    assert condition(wire((await reconcile(body, cluster, NOW)).status), "Ready") == ("False", "TLSSecretInvalid")
    cluster.put_secret("clients", {"ca.crt": certs.issue_ca("clients", NOW).cert_pem})
    ok = await reconcile(body, cluster, NOW)
    assert ("Deployment", "demo-v1") in cluster.objects
    assert wire(ok.status)["tls"]["mode"] == "SelfSigned"


async def test_disabled_reads_no_secret(make_body: Body) -> None:
    cluster = TLSFakeCluster()
    model = parse_inference_model(make_body())
    state = plan_tls(model, await observe_tls(model, cluster), NOW)
    assert (state.problem, state.applied, cluster.reads) == (None, (), [])
    outcome = await reconcile(make_body(), cluster, NOW)
    assert wire(outcome.status)["tls"] == {"mode": "Disabled", "secretName": None, "notAfter": None, "dnsNames": None}


async def test_longest_names_fit_in_a_certificate(make_body: Body) -> None:
    """A common name is at most 64 characters (found by the e2e suite: namespaces are long)."""
    cluster = TLSFakeCluster()
    body = make_body(name="m" * 42, namespace="n" * 63, tls=SELF_SIGNED)
    body["spec"]["versions"][0]["name"] = "v" * 20
    outcome = await reconcile(body, cluster, NOW)
    assert condition(wire(outcome.status), "Ready") == ("False", "RollingOut")
    assert f"{'m' * 42}-{'v' * 20}.{'n' * 63}.svc.cluster.local" in wire(outcome.status)["tls"]["dnsNames"]


# -- ownership and Secrets a model may not mount ----------------------------------------------------------------


async def test_self_signed_never_takes_over_an_existing_secret(make_body: Body) -> None:
    cluster = TLSFakeCluster()
    cluster.put_secret("demo-tls-ca", {"ca.crt": b"theirs", "ca.key": b"theirs"})
    before = copy.deepcopy(cluster.objects)
    outcome = await reconcile(make_body(tls=SELF_SIGNED), cluster, NOW)
    assert outcome.applied == ()
    assert cluster.objects == before
    assert condition(wire(outcome.status), "Ready") == ("False", "NameConflict")
    message = next(c["message"] for c in wire(outcome.status)["conditions"] if c["type"] == "Ready")
    assert "Secret/demo-tls-ca exists" in message
    assert "theirs" not in json.dumps(wire(outcome.status))


async def test_a_service_name_conflict_writes_no_tls_secret_or_certificate(make_body: Body) -> None:
    """The conflict is found before anything is written: not even the TLS step's Secrets (SelfSigned) or its
    Certificate (CertManager) are applied for a model that cannot have its Service."""
    cert_manager = {"mode": "CertManager", "issuerRef": {"name": "corp"}}
    for tls, crds in ((SELF_SIGNED, ()), (cert_manager, ("certificates.cert-manager.io",))):
        cluster = TLSFakeCluster(crds=crds)
        cluster.objects[("Service", "demo")] = {"kind": "Service", "metadata": {"name": "demo"}, "spec": {}}
        before = copy.deepcopy(cluster.objects)
        outcome = await reconcile(make_body(tls=tls), cluster, NOW)
        assert condition(wire(outcome.status), "Ready") == ("False", "NameConflict")
        assert "Service/demo exists" in wire(outcome.status)["conditions"][0]["message"]
        assert outcome.applied == ()
        assert cluster.objects == before  # no Secret demo-tls-ca / demo-tls, no Certificate

        # The allowed variant: the Service gone, the same model writes its TLS objects (and, SelfSigned, its
        # children; CertManager's wait for the certificate to be issued).
        del cluster.objects[("Service", "demo")]
        outcome = await reconcile(make_body(tls=tls), cluster, NOW)
        written = ("Secret/demo-tls", "Service/demo") if tls is SELF_SIGNED else ("Certificate/demo-tls",)
        assert set(written) <= set(outcome.applied)


async def test_cert_manager_refuses_a_secret_it_did_not_issue_and_a_foreign_certificate(make_body: Body) -> None:
    cluster = TLSFakeCluster(crds=("certificates.cert-manager.io",))
    body = make_body(tls={"mode": "CertManager", "issuerRef": {"name": "corp"}})
    cluster.put_secret("demo-tls", {"password": b"x"})  # someone's Secret: cert-manager would overwrite it
    outcome = await reconcile(body, cluster, NOW)
    assert condition(wire(outcome.status), "Ready") == ("False", "NameConflict")
    assert ("Certificate", "demo-tls") not in cluster.objects

    del cluster.objects[("Secret", "demo-tls")]
    cluster.objects[("Certificate", "demo-tls")] = {"kind": "Certificate", "metadata": {"name": "demo-tls"}}
    outcome = await reconcile(body, cluster, NOW)
    assert condition(wire(outcome.status), "Ready") == ("False", "NameConflict")
    assert "Certificate/demo-tls exists" in wire(outcome.status)["conditions"][0]["message"]
    assert cluster.objects[("Certificate", "demo-tls")] == {"kind": "Certificate", "metadata": {"name": "demo-tls"}}


async def test_service_account_token_secrets_are_refused(make_body: Body) -> None:
    cluster = TLSFakeCluster()
    token = "kubernetes.io/service-account-token"
    cluster.put_secret("sa-token", {"ca.crt": certs.issue_ca("x", NOW).cert_pem, "token": b"t"}, kind=token)
    mutual = await reconcile(make_body(tls={**SELF_SIGNED, "clientCASecretName": "sa-token"}), cluster, NOW)
    assert condition(wire(mutual.status), "Ready") == ("False", "SecretRefused")
    assert "spec.tls.clientCASecretName: Secret 'sa-token'" in wire(mutual.status)["conditions"][0]["message"]
    assert ("Deployment", "demo-v1") not in cluster.objects

    cluster.put_secret("sa-cert", user_secret(NOW, datetime.timedelta(days=30)), kind=token)
    refused = await reconcile(make_body(tls={"mode": "Secret", "secretName": "sa-cert"}), cluster, NOW)
    assert condition(wire(refused.status), "Ready") == ("False", "SecretRefused")


async def test_ca_rotation_keeps_the_old_ca_signing_until_clients_had_the_bundle_for_the_overlap(
    make_body: Body,
) -> None:
    cluster = TLSFakeCluster()
    body = make_body(tls=SELF_SIGNED)
    await reconcile(body, cluster, NOW)
    old_ca = x509.load_pem_x509_certificate(cluster.secret("demo-tls-ca")["ca.crt"])

    announced_at = NOW + certs.CA_LIFETIME * 2 / 3 + datetime.timedelta(days=1)
    announced = await reconcile(body, cluster, announced_at)
    assert "CARotationStarted" in [e.reason for e in announced.events]
    bundle = cluster.secret("demo-tls")["ca.crt"]
    new_ca = x509.load_pem_x509_certificate(cluster.secret("demo-tls-ca")["next.crt"])
    assert x509.load_pem_x509_certificates(bundle) == [old_ca, new_ca]
    cluster.certificate().verify_directly_issued_by(old_ca)  # clients that know only the old CA still connect

    switched = await reconcile(body, cluster, announced_at + certs.CA_OVERLAP + datetime.timedelta(hours=1))
    assert "CARotated" in [e.reason for e in switched.events]
    cluster.certificate().verify_directly_issued_by(new_ca)
    assert x509.load_pem_x509_certificates(cluster.secret("demo-tls")["ca.crt"]) == [new_ca, old_ca]
    assert cluster.secret("demo-tls-ca")["ca.crt"] == new_ca.public_bytes(serialization.Encoding.PEM)
    assert "ca.key" in cluster.secret("demo-tls-ca")


async def test_a_ca_made_before_name_constraints_is_rotated_into_one_with_the_overlap(make_body: Body) -> None:
    cluster = TLSFakeCluster()
    body = make_body(tls=SELF_SIGNED)
    await reconcile(body, cluster, NOW)
    old = certs.issue_ca("demo skiff CA", NOW)  # what an operator without constraints made
    stored = {"ca.crt": old.cert_pem, "ca.key": old.key_pem}
    cluster.objects[("Secret", "demo-tls-ca")]["data"] = {k: base64.b64encode(v).decode() for k, v in stored.items()}
    upgraded = await reconcile(body, cluster, NOW + datetime.timedelta(days=1))
    assert "CARotationStarted" in [e.reason for e in upgraded.events]
    old_ca = x509.load_pem_x509_certificate(old.cert_pem)
    cluster.certificate().verify_directly_issued_by(old_ca)  # still signing for the overlap
    successor = x509.load_pem_x509_certificate(cluster.secret("demo-tls-ca")["next.crt"])
    assert successor.extensions.get_extension_for_class(x509.NameConstraints).critical

    switched = await reconcile(body, cluster, NOW + datetime.timedelta(days=1) + certs.CA_OVERLAP * 2)
    assert "CARotated" in [e.reason for e in switched.events]
    cluster.certificate().verify_directly_issued_by(successor)
