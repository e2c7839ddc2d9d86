"""Certificates for a model's TLS: the SAN set, issuing a CA and server certificates, reading certificates
back, and deciding when to renew. Pure computation (the `cryptography` package); no API I/O.

Private keys only ever leave this module as PEM bytes destined for a Secret's data; nothing here logs or
formats them into messages.
"""

from __future__ import annotations

import datetime
import enum
import hashlib
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_LIFETIME = datetime.timedelta(days=365)
SERVER_LIFETIME = datetime.timedelta(days=90)
RENEW_AT_FRACTION = 2 / 3  # renew once two thirds of the lifetime have passed
# A CA due for renewal is first announced (its successor added to the trusted bundle) and signs only this long
# later, so that clients can pick up the bundle first. 2/3 of a year + 30 days leaves the old CA 92 days: longer
# than a server certificate it signed (90).
CA_OVERLAP = datetime.timedelta(days=30)
CLOCK_SKEW = datetime.timedelta(minutes=5)

TLS_CERT_KEY = "tls.crt"
TLS_KEY_KEY = "tls.key"
CA_CERT_KEY = "ca.crt"
CA_KEY_KEY = "ca.key"
NEXT_CERT_KEY = "next.crt"  # the announced successor of the CA, and its key
NEXT_KEY_KEY = "next.key"
PREVIOUS_CERT_KEY = "previous.crt"  # the CA it replaced, trusted until it expires
CLUSTER_DOMAIN = "cluster.local"


def service_dns_names(
    model_service: str, version_services: Iterable[str], namespace: str, cluster_domain: str = CLUSTER_DOMAIN
) -> list[str]:
    """The names a client may dial: the model Service short, namespaced, .svc and fully qualified; each version
    Service .svc and fully qualified. Every one lies inside `permitted_dns_subtrees`: a version Service's short
    forms (`<name>-<version>`, `<name>-<version>.<ns>`) would not, and covering them would need a new CA (and new
    trust on every client) for each added version."""
    found = [model_service, f"{model_service}.{namespace}"]
    for service in (model_service, *version_services):
        for name in (f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.{cluster_domain}"):
            if name not in found:
                found.append(name)
    return found


def permitted_dns_subtrees(model_service: str, namespace: str, cluster_domain: str = CLUSTER_DOMAIN) -> list[str]:
    """The NameConstraints of a model's CA: the namespace's Service names (`*.<ns>.svc`, `*.<ns>.svc.<domain>`) and
    the model Service's two short forms. A DNS constraint is a subtree: `<name>` permits `<name>` and names ending
    in `.<name>`, never `<name>-v1` (matching is by whole labels)."""
    return [model_service, f"{model_service}.{namespace}", f"{namespace}.svc", f"{namespace}.svc.{cluster_domain}"]


def within_dns_subtrees(name: str, subtrees: Iterable[str]) -> bool:
    """Whether a DNS name lies inside one of the subtrees, by whole labels (RFC 5280 4.2.1.10)."""
    name = name.lower()
    return any(name == tree.lower() or name.endswith("." + tree.lower()) for tree in subtrees)


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, as PEM."""

    cert_pem: bytes
    key_pem: bytes


@dataclass(frozen=True)
class CertificateInfo:
    """What the operator needs to know about a certificate (never the key)."""

    subject: str
    dns_names: tuple[str, ...]
    not_before: datetime.datetime
    not_after: datetime.datetime
    issuer_fingerprint: str  # sha256 of the issuer name + authority key id, enough to notice a new CA
    is_ca: bool

    @property
    def lifetime(self) -> datetime.timedelta:
        return self.not_after - self.not_before

    @property
    def renew_at(self) -> datetime.datetime:
        return self.not_before + self.lifetime * RENEW_AT_FRACTION


class RenewReason(enum.StrEnum):
    MISSING = "Missing"
    UNREADABLE = "Unreadable"
    EXPIRED = "Expired"
    NEAR_EXPIRY = "NearExpiry"
    SANS_CHANGED = "SANsChanged"
    CA_CHANGED = "CAChanged"


@dataclass(frozen=True)
class RenewDecision:
    renew: bool
    reason: RenewReason | None = None
    message: str = ""


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "skiff"), x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    )


def issue_ca(
    common_name: str,
    now: datetime.datetime,
    lifetime: datetime.timedelta = CA_LIFETIME,
    permitted: Sequence[str] = (),
) -> KeyPair:
    """A CA certificate and key; with `permitted` DNS subtrees it carries critical NameConstraints: verifiers refuse
    any certificate it signs for another DNS name, or for any IP address."""
    key = _new_key()
    subject = _name(common_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + lifetime)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if permitted:
        cert = cert.add_extension(_name_constraints(permitted), critical=True)
    signed = cert.sign(key, hashes.SHA256())
    return KeyPair(signed.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _name_constraints(permitted: Sequence[str]) -> x509.NameConstraints:
    """DNS names only inside `permitted`; no IP address at all (a leaf for the API server's ClusterIP would
    otherwise pass, since DNS subtrees say nothing about IP SANs)."""
    return x509.NameConstraints(
        permitted_subtrees=[x509.DNSName(tree) for tree in permitted],
        excluded_subtrees=[x509.IPAddress(ipaddress.ip_network(net)) for net in ("0.0.0.0/0", "::/0")],
    )


def ca_constraints(cert_pem: bytes) -> tuple[str, ...] | None:
    """The permitted DNS subtrees of a CA certificate; None when it has no NameConstraints."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        constraints = cert.extensions.get_extension_for_class(x509.NameConstraints).value
    except x509.ExtensionNotFound:
        return None
    return tuple(tree.value for tree in constraints.permitted_subtrees or () if isinstance(tree, x509.DNSName))


def issue_server_certificate(
    ca: KeyPair, dns_names: list[str], now: datetime.datetime, lifetime: datetime.timedelta = SERVER_LIFETIME
) -> KeyPair:
    """A server certificate for `dns_names`, signed by `ca`."""
    if not dns_names:
        raise ValueError("a server certificate needs at least one DNS name")
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an EC key")
    permitted = ca_constraints(ca.cert_pem)
    outside = [n for n in dns_names if permitted is not None and not within_dns_subtrees(n, permitted)]
    if outside:  # every verifier would refuse the certificate: a bug in the SAN set, never a user error
        raise ValueError(f"DNS names {outside} are outside the CA's NameConstraints {list(permitted or ())}")
    key = _new_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(dns_names[0]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + lifetime)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _fingerprint_issuer(cert: x509.Certificate) -> str:
    try:
        aki = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value.key_identifier or b""
    except x509.ExtensionNotFound:
        aki = b""
    return hashlib.sha256(cert.issuer.public_bytes() + aki).hexdigest()[:16]


def read_certificate(cert_pem: bytes) -> CertificateInfo:
    """Facts about the first certificate in a PEM chain; ValueError if it is not one."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns_names = tuple(sans.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        dns_names = ()
    try:
        is_ca = bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        is_ca = False
    return CertificateInfo(
        subject=cert.subject.rfc4514_string(),
        dns_names=dns_names,
        not_before=cert.not_valid_before_utc,
        not_after=cert.not_valid_after_utc,
        issuer_fingerprint=_fingerprint_issuer(cert),
        is_ca=is_ca,
    )


def ca_fingerprint(ca_cert_pem: bytes) -> str:
    """The issuer fingerprint that certificates signed by this CA carry."""
    cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ski = cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest
    return hashlib.sha256(cert.subject.public_bytes() + ski).hexdigest()[:16]


def decide_renewal(
    current: bytes | None, wanted_dns_names: Iterable[str], now: datetime.datetime, issuer: str | None = None
) -> RenewDecision:
    """Renew when the certificate is missing or unreadable, expired or past 2/3 of its life, when its SAN set
    differs from the wanted one, or when it was not signed by the current CA (`issuer` fingerprint)."""
    if not current:
        return RenewDecision(True, RenewReason.MISSING, "no certificate yet")
    try:
        info = read_certificate(current)
    except ValueError:
        return RenewDecision(True, RenewReason.UNREADABLE, "the stored certificate is not valid PEM")
    if now >= info.not_after:
        return RenewDecision(True, RenewReason.EXPIRED, f"expired at {info.not_after.isoformat()}")
    if now >= info.renew_at:
        return RenewDecision(True, RenewReason.NEAR_EXPIRY, f"expires at {info.not_after.isoformat()}")
    wanted = sorted(set(wanted_dns_names))
    if sorted(set(info.dns_names)) != wanted:
        added = sorted(set(wanted) - set(info.dns_names))
        removed = sorted(set(info.dns_names) - set(wanted))
        return RenewDecision(True, RenewReason.SANS_CHANGED, f"DNS names added {added}, removed {removed}")
    if issuer is not None and info.issuer_fingerprint != issuer:
        return RenewDecision(True, RenewReason.CA_CHANGED, "signed by a CA other than the current one")
    return RenewDecision(False, None, f"valid until {info.not_after.isoformat()}")


def check_tls_secret(data: Mapping[str, bytes], now: datetime.datetime) -> list[str]:
    """Problems with a user-provided kubernetes.io/tls Secret, as messages a user can act on (never key bytes)."""
    problems = [f"missing key {k!r}" for k in (TLS_CERT_KEY, TLS_KEY_KEY) if not data.get(k)]
    if problems:
        return problems
    try:
        cert = x509.load_pem_x509_certificate(data[TLS_CERT_KEY])
    except ValueError:
        return [f"{TLS_CERT_KEY!r} is not a PEM certificate"]
    try:
        key = serialization.load_pem_private_key(data[TLS_KEY_KEY], password=None)
    except (ValueError, TypeError):
        return [f"{TLS_KEY_KEY!r} is not an unencrypted PEM private key"]
    if cert.not_valid_after_utc <= now:
        problems.append(f"certificate expired at {cert.not_valid_after_utc.isoformat()}")
    if cert.not_valid_before_utc > now + CLOCK_SKEW:
        problems.append(f"certificate is not valid before {cert.not_valid_before_utc.isoformat()}")
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(serialization.Encoding.PEM, public) != cert.public_key().public_bytes(
        serialization.Encoding.PEM, public
    ):
        problems.append(f"{TLS_KEY_KEY!r} does not belong to the certificate in {TLS_CERT_KEY!r}")
    if data.get(CA_CERT_KEY):
        try:
            ca = x509.load_pem_x509_certificate(data[CA_CERT_KEY])
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            problems.append(f"the certificate was not issued by the CA in {CA_CERT_KEY!r}")
    return problems


# -- the CA's rotation, with an overlap ------------------------------------------------------------------------


class CAStep(enum.StrEnum):
    KEPT = "Kept"
    ISSUED = "Issued"  # none (or none usable): a new CA signs at once, nothing to overlap with
    ANNOUNCED = "Announced"  # past 2/3 of its life: the successor joins the bundle, the current CA still signs
    PROMOTED = "Promoted"  # the overlap is over: the successor signs, the old CA stays in the bundle


@dataclass(frozen=True)
class CAChain:
    """A model's CA Secret: the CA that signs now, its announced successor, and the CA it replaced."""

    current: KeyPair
    next: KeyPair | None = None
    previous: bytes | None = None  # a certificate only; its key is gone

    def bundle(self) -> bytes:
        """What clients trust (`ca.crt` of the server Secret): every CA of the chain."""
        return b"".join(pem for pem in (self.current.cert_pem, self.next and self.next.cert_pem, self.previous) if pem)

    def secret_data(self) -> dict[str, bytes]:
        data = {CA_CERT_KEY: self.current.cert_pem, CA_KEY_KEY: self.current.key_pem}
        if self.next is not None:
            data |= {NEXT_CERT_KEY: self.next.cert_pem, NEXT_KEY_KEY: self.next.key_pem}
        if self.previous is not None:
            data[PREVIOUS_CERT_KEY] = self.previous
        return data


def rotate_ca(
    stored: Mapping[str, bytes],
    common_name: str,
    now: datetime.datetime,
    overlap: datetime.timedelta = CA_OVERLAP,
    permitted: Sequence[str] = (),
) -> tuple[CAChain, CAStep]:
    """The CA chain to keep in the CA Secret now, and the step that led to it. A CA past 2/3 of its lifetime, or
    whose NameConstraints are not `permitted` (a CA made before constraints existed), is announced first (a
    successor in the bundle, the old CA still signing); `overlap` later the successor signs. The CA it replaced
    stays in the bundle until a certificate it signed could not be valid any more."""
    current = usable_ca(stored.get(CA_CERT_KEY), stored.get(CA_KEY_KEY), now)
    if current is None:
        return CAChain(issue_ca(common_name, now, permitted=permitted)), CAStep.ISSUED
    successor = usable_ca(stored.get(NEXT_CERT_KEY), stored.get(NEXT_KEY_KEY), now)
    if successor is not None and not _constrained_to(successor, permitted):
        successor = None  # announced before the constraints changed: announce one that has them
    previous = stored.get(PREVIOUS_CERT_KEY)
    trusted_until = read_certificate(current.cert_pem).not_before + CLOCK_SKEW + overlap + SERVER_LIFETIME
    if previous is not None and (now >= trusted_until or not _valid_certificate(previous, now)):
        previous = None
    if successor is not None and now >= read_certificate(successor.cert_pem).not_before + CLOCK_SKEW + overlap:
        return CAChain(successor, None, current.cert_pem), CAStep.PROMOTED
    due = now >= read_certificate(current.cert_pem).renew_at or not _constrained_to(current, permitted)
    if successor is None and due:
        return CAChain(current, issue_ca(common_name, now, permitted=permitted), previous), CAStep.ANNOUNCED
    return CAChain(current, successor, previous), CAStep.KEPT


def _constrained_to(ca: KeyPair, permitted: Sequence[str]) -> bool:
    found = ca_constraints(ca.cert_pem)
    return (found or ()) == tuple(permitted)


def usable_ca(cert_pem: bytes | None, key_pem: bytes | None, now: datetime.datetime) -> KeyPair | None:
    """A CA the operator made that can still sign: readable, a CA, its key matches, not expired."""
    if not cert_pem or not key_pem:
        return None
    if check_tls_secret({TLS_CERT_KEY: cert_pem, TLS_KEY_KEY: key_pem}, now):
        return None  # expired, not yet valid, the key does not belong to the certificate, or unreadable
    try:
        ca_fingerprint(cert_pem)
    except x509.ExtensionNotFound:  # no SubjectKeyIdentifier: not one of ours
        return None
    return KeyPair(cert_pem, key_pem) if read_certificate(cert_pem).is_ca else None


def _valid_certificate(cert_pem: bytes, now: datetime.datetime) -> bool:
    try:
        return now < read_certificate(cert_pem).not_after
    except ValueError:
        return False
