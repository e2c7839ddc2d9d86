"""The SelfSigned CA's NameConstraints against real verifiers: a gRPC client (BoringSSL) talking to a real gRPC
server on loopback accepts the operator's certificate by every name it carries, and refuses a certificate forged
with the CA's key for any name outside the constraints; `cryptography`'s verifier agrees."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterator, Sequence
from concurrent import futures
from contextlib import contextmanager

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509 import verification
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from skiff_operator import certs

NOW = datetime.datetime.now(datetime.UTC)
MODEL, NAMESPACE = "fraud", "models"
SANS = certs.service_dns_names(MODEL, [f"{MODEL}-v1", f"{MODEL}-v2"], NAMESPACE)
# Names a holder of the CA key might want clients of this model to accept: the API server, the same model name
# in another namespace, a version's short name (outside by design), a public name; an IP address goes separately.
OUTSIDE = [
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
    f"{MODEL}.other.svc",
    f"{MODEL}.other.svc.cluster.local",
    f"{MODEL}-v1",
    f"{MODEL}-v1.{NAMESPACE}",
    "evil.example.com",
]


@pytest.fixture(scope="module")
def constrained() -> certs.KeyPair:
    return certs.issue_ca(f"{MODEL} skiff CA", NOW, permitted=certs.permitted_dns_subtrees(MODEL, NAMESPACE))


@pytest.fixture(scope="module")
def unconstrained() -> certs.KeyPair:
    return certs.issue_ca(f"{MODEL} skiff CA", NOW)


def forge(ca: certs.KeyPair, sans: Sequence[x509.GeneralName]) -> certs.KeyPair:
    """A server certificate signed with the CA's key for any names: what whoever can read the CA Secret can make
    (issue_server_certificate would refuse names outside the constraints)."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "forged")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - datetime.timedelta(minutes=5))
        .not_valid_after(NOW + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return certs.KeyPair(cert.public_bytes(pem), key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                                   serialization.NoEncryption()))  # fmt: skip


@contextmanager
def serving(leaf: certs.KeyPair) -> Iterator[int]:
    """A real gRPC server on loopback presenting `leaf`; yields its port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(leaf.key_pem, leaf.cert_pem)]))
    server.start()
    try:
        yield port
    finally:
        server.stop(None)


def check(port: int, ca: certs.KeyPair, name: str | None) -> grpc.StatusCode:
    """A health check over TLS trusting only `ca`, checking the server's certificate for `name` (None: the
    address dialled, 127.0.0.1)."""
    options = [("grpc.ssl_target_name_override", name)] if name else []
    credentials = grpc.ssl_channel_credentials(root_certificates=ca.cert_pem)
    with grpc.secure_channel(f"127.0.0.1:{port}", credentials, options=options) as channel:
        try:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.RpcError as error:
            return error.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def test_the_operators_certificate_is_accepted_by_every_name_it_carries(constrained: certs.KeyPair) -> None:
    leaf = certs.issue_server_certificate(constrained, SANS, NOW)
    with serving(leaf) as port:
        assert {name: check(port, constrained, name) for name in SANS} == {name: grpc.StatusCode.OK for name in SANS}
        assert check(port, constrained, "fraud-v9.models.svc") is grpc.StatusCode.UNAVAILABLE  # not in the SANs


@pytest.mark.parametrize("name", OUTSIDE)
def test_a_forged_certificate_outside_the_constraints_is_refused(
    constrained: certs.KeyPair, unconstrained: certs.KeyPair, name: str
) -> None:
    # The same forgery from a CA without constraints passes: the refusal is the constraint's doing.
    with serving(forge(unconstrained, [x509.DNSName(name)])) as port:
        assert check(port, unconstrained, name) is grpc.StatusCode.OK
    with serving(forge(constrained, [x509.DNSName(name)])) as port:
        assert check(port, constrained, name) is grpc.StatusCode.UNAVAILABLE


def test_one_name_outside_spoils_a_certificate_with_names_inside(constrained: certs.KeyPair) -> None:
    with serving(forge(constrained, [x509.DNSName(SANS[0]), x509.DNSName("kubernetes.default.svc")])) as port:
        assert check(port, constrained, SANS[0]) is grpc.StatusCode.UNAVAILABLE


def test_a_forged_certificate_for_an_ip_address_is_refused(
    constrained: certs.KeyPair, unconstrained: certs.KeyPair
) -> None:
    address = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))  # think of the API server's ClusterIP
    with serving(forge(unconstrained, [address])) as port:
        assert check(port, unconstrained, None) is grpc.StatusCode.OK
    with serving(forge(constrained, [address])) as port:
        assert check(port, constrained, None) is grpc.StatusCode.UNAVAILABLE


def _verify(ca: certs.KeyPair, leaf: certs.KeyPair, name: str) -> None:
    store = verification.Store([x509.load_pem_x509_certificate(ca.cert_pem)])
    verifier = verification.PolicyBuilder().store(store).time(NOW).build_server_verifier(x509.DNSName(name))
    verifier.verify(x509.load_pem_x509_certificate(leaf.cert_pem), [])


def test_cryptographys_verifier_agrees(constrained: certs.KeyPair) -> None:
    leaf = certs.issue_server_certificate(constrained, SANS, NOW)
    for name in SANS:
        _verify(constrained, leaf, name)
    for name in OUTSIDE:
        with pytest.raises(verification.VerificationError, match=r"name constraint|no permitted"):
            _verify(constrained, forge(constrained, [x509.DNSName(name)]), name)
