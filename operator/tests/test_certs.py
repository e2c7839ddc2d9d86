"""Certificates without a cluster: SAN sets, issuing, the renewal decision table, user Secret checks."""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509

from skiff_operator import certs

NOW = datetime.datetime(2026, 11, 30, 12, 0, tzinfo=datetime.UTC)
DAY = datetime.timedelta(days=1)


@pytest.fixture(scope="module")
def ca() -> certs.KeyPair:
    return certs.issue_ca("skiff-ca fraud", NOW)


@pytest.fixture(scope="module")
def other_ca() -> certs.KeyPair:
    return certs.issue_ca("another", NOW)


SANS = certs.service_dns_names("fraud", ["fraud-v1", "fraud-v2"], "models")
PERMITTED = certs.permitted_dns_subtrees("fraud", "models")


def test_san_set_covers_the_model_service_in_every_form_and_versions_dotted() -> None:
    assert certs.service_dns_names("fraud", ["fraud-v1"], "models") == [
        "fraud",
        "fraud.models",
        "fraud.models.svc",
        "fraud.models.svc.cluster.local",
        "fraud-v1.models.svc",
        "fraud-v1.models.svc.cluster.local",
    ]
    assert certs.service_dns_names("a", ["a"], "ns", "corp.example")[-1] == "a.ns.svc.corp.example"
    assert len(certs.service_dns_names("a", ["a"], "ns")) == 4


def test_every_san_lies_inside_the_constraints_and_a_new_version_needs_no_new_ones() -> None:
    assert PERMITTED == ["fraud", "fraud.models", "models.svc", "models.svc.cluster.local"]
    many = certs.service_dns_names("fraud", [f"fraud-v{i}" for i in range(30)], "models")
    assert all(certs.within_dns_subtrees(name, PERMITTED) for name in many)


@pytest.mark.parametrize(
    ("name", "inside"),
    [
        ("fraud", True),
        ("FRAUD.Models", True),
        ("x.fraud", True),  # a subtree: names below it too
        ("fraud-v1", False),  # whole labels: a version's short name is not under "fraud"
        ("fraud-v1.models", False),
        ("fraud-v1.models.svc", True),
        ("other.models.svc.cluster.local", True),  # the namespace's Services: the constraint's granularity
        ("kubernetes.default.svc", False),
        ("fraud.other.svc", False),
        ("fraud.other.svc.cluster.local", False),
        ("evil.example.com", False),
        ("xmodels.svc", False),
    ],
)
def test_within_dns_subtrees_matches_whole_labels(name: str, inside: bool) -> None:
    assert certs.within_dns_subtrees(name, PERMITTED) is inside


def test_a_constrained_ca_carries_critical_name_constraints_and_refuses_to_sign_outside_them() -> None:
    ca = certs.issue_ca("fraud skiff CA", NOW, permitted=PERMITTED)
    extension = x509.load_pem_x509_certificate(ca.cert_pem).extensions.get_extension_for_class(x509.NameConstraints)
    assert extension.critical
    assert certs.ca_constraints(ca.cert_pem) == tuple(PERMITTED)
    excluded = [str(tree.value) for tree in extension.value.excluded_subtrees or ()]
    assert excluded == ["0.0.0.0/0", "::/0"]  # no IP address at all
    certs.issue_server_certificate(ca, SANS, NOW)
    with pytest.raises(ValueError, match=r"\['fraud-v1'\] are outside the CA's NameConstraints"):
        certs.issue_server_certificate(ca, [*SANS, "fraud-v1"], NOW)
    assert certs.ca_constraints(certs.issue_ca("plain", NOW).cert_pem) is None


def test_server_certificate_is_signed_by_the_ca_with_the_sans(ca: certs.KeyPair) -> None:
    pair = certs.issue_server_certificate(ca, SANS, NOW)
    info = certs.read_certificate(pair.cert_pem)
    assert list(info.dns_names) == SANS
    assert not info.is_ca
    assert info.not_after - NOW == certs.SERVER_LIFETIME
    assert info.issuer_fingerprint == certs.ca_fingerprint(ca.cert_pem)
    x509.load_pem_x509_certificate(pair.cert_pem).verify_directly_issued_by(x509.load_pem_x509_certificate(ca.cert_pem))
    assert b"PRIVATE KEY" in pair.key_pem
    assert certs.read_certificate(ca.cert_pem).is_ca


def test_server_certificate_needs_a_name(ca: certs.KeyPair) -> None:
    with pytest.raises(ValueError, match="at least one DNS name"):
        certs.issue_server_certificate(ca, [], NOW)


def _cert(ca: certs.KeyPair, sans: list[str] = SANS, issued: datetime.datetime = NOW) -> bytes:
    return certs.issue_server_certificate(ca, sans, issued).cert_pem


@pytest.mark.parametrize(
    ("case", "now_offset", "wanted", "renew", "reason"),
    [
        ("fresh", 0 * DAY, SANS, False, None),
        ("half way", 45 * DAY, SANS, False, None),
        ("just before two thirds", 59 * DAY, SANS, False, None),
        ("past two thirds", 61 * DAY, SANS, True, certs.RenewReason.NEAR_EXPIRY),
        ("expired", 91 * DAY, SANS, True, certs.RenewReason.EXPIRED),
        ("service added", 0 * DAY, [*SANS, "fraud-v3.models.svc"], True, certs.RenewReason.SANS_CHANGED),
        ("service removed", 0 * DAY, SANS[:-2], True, certs.RenewReason.SANS_CHANGED),
        ("same names, other order", 0 * DAY, list(reversed(SANS)), False, None),
    ],
)
def test_renewal_decision_table(ca, case, now_offset, wanted, renew, reason) -> None:
    decision = certs.decide_renewal(_cert(ca), wanted, NOW + now_offset, certs.ca_fingerprint(ca.cert_pem))
    assert (decision.renew, decision.reason) == (renew, reason), case


def test_missing_unreadable_and_foreign_certificates_are_renewed(ca, other_ca) -> None:
    issuer = certs.ca_fingerprint(ca.cert_pem)
    assert certs.decide_renewal(None, SANS, NOW, issuer).reason is certs.RenewReason.MISSING
    assert certs.decide_renewal(b"", SANS, NOW, issuer).reason is certs.RenewReason.MISSING
    assert certs.decide_renewal(b"garbage", SANS, NOW, issuer).reason is certs.RenewReason.UNREADABLE
    assert certs.decide_renewal(_cert(other_ca), SANS, NOW, issuer).reason is certs.RenewReason.CA_CHANGED


def test_san_change_message_names_what_changed(ca) -> None:
    decision = certs.decide_renewal(_cert(ca), [*SANS, "fraud-v3"], NOW)
    assert "added ['fraud-v3']" in decision.message


def _secret(pair: certs.KeyPair, ca: certs.KeyPair | None = None) -> dict[str, bytes]:
    data = {"tls.crt": pair.cert_pem, "tls.key": pair.key_pem}
    if ca is not None:
        data["ca.crt"] = ca.cert_pem
    return data


def test_a_good_user_secret_has_no_problems(ca) -> None:
    assert certs.check_tls_secret(_secret(certs.issue_server_certificate(ca, SANS, NOW), ca), NOW) == []


def test_user_secret_problems_are_readable_and_never_show_the_key(ca, other_ca) -> None:
    good = certs.issue_server_certificate(ca, SANS, NOW)
    other = certs.issue_server_certificate(ca, SANS, NOW)
    cases = {
        "missing": ({"tls.crt": good.cert_pem}, "missing key 'tls.key'"),
        "not pem": ({"tls.crt": b"hello", "tls.key": good.key_pem}, "'tls.crt' is not a PEM certificate"),
        "bad key": ({"tls.crt": good.cert_pem, "tls.key": b"nope"}, "'tls.key' is not an unencrypted PEM"),
        "mismatch": ({"tls.crt": good.cert_pem, "tls.key": other.key_pem}, "does not belong to the certificate"),
        "expired": (_secret(certs.issue_server_certificate(ca, SANS, NOW - 100 * DAY)), "certificate expired at"),
        "wrong ca": (_secret(good, other_ca), "was not issued by the CA in 'ca.crt'"),
    }
    for case, (data, message) in cases.items():
        problems = certs.check_tls_secret(data, NOW)
        assert any(message in p for p in problems), (case, problems)
        assert not any("PRIVATE KEY" in p or "MII" in p for p in problems), case


# -- CA rotation with an overlap --------------------------------------------------------------------------------


def pems(bundle: bytes) -> list[bytes]:
    marker = b"-----END CERTIFICATE-----\n"
    return [part + marker for part in bundle.split(marker) if part.strip()]


def test_ca_rotation_announces_the_successor_then_switches_after_the_overlap() -> None:
    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    chain, step = certs.rotate_ca({}, "m skiff CA", start)
    assert step is certs.CAStep.ISSUED
    assert chain.bundle() == chain.current.cert_pem
    first = chain.current

    renew_at = certs.read_certificate(first.cert_pem).renew_at
    kept, step = certs.rotate_ca(chain.secret_data(), "m skiff CA", renew_at - datetime.timedelta(hours=1))
    assert (step, kept) == (certs.CAStep.KEPT, chain)

    announced_at = renew_at + datetime.timedelta(hours=1)
    announced, step = certs.rotate_ca(chain.secret_data(), "m skiff CA", announced_at)
    assert step is certs.CAStep.ANNOUNCED
    assert announced.current == first  # the old CA still signs
    assert announced.next is not None
    assert pems(announced.bundle()) == [first.cert_pem, announced.next.cert_pem]  # clients learn both
    assert sorted(announced.secret_data()) == ["ca.crt", "ca.key", "next.crt", "next.key"]

    during = announced_at + certs.CA_OVERLAP - datetime.timedelta(hours=1)
    assert certs.rotate_ca(announced.secret_data(), "m skiff CA", during) == (announced, certs.CAStep.KEPT)

    after = announced_at + certs.CA_OVERLAP + datetime.timedelta(hours=1)
    promoted, step = certs.rotate_ca(announced.secret_data(), "m skiff CA", after)
    assert step is certs.CAStep.PROMOTED
    assert promoted.current == announced.next
    assert promoted.previous == first.cert_pem  # still trusted: pods may serve its leaf for a minute more
    assert certs.read_certificate(first.cert_pem).not_after - after > certs.SERVER_LIFETIME

    expired = certs.read_certificate(first.cert_pem).not_after + datetime.timedelta(hours=1)
    cleaned, step = certs.rotate_ca(promoted.secret_data(), "m skiff CA", expired)
    assert step is certs.CAStep.KEPT
    assert cleaned.previous is None
    assert sorted(cleaned.secret_data()) == ["ca.crt", "ca.key"]


def test_an_unusable_ca_is_replaced_at_once() -> None:
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    other = certs.issue_ca("other", now)
    chain, _ = certs.rotate_ca({}, "m", now)
    mismatched = {**chain.secret_data(), "ca.key": other.key_pem}
    replaced, step = certs.rotate_ca(mismatched, "m", now)
    assert step is certs.CAStep.ISSUED
    assert replaced.current != chain.current
    assert certs.read_certificate(replaced.current.cert_pem).lifetime == certs.CA_LIFETIME + certs.CLOCK_SKEW


def test_a_ca_without_name_constraints_is_rotated_into_a_constrained_one_with_the_overlap() -> None:
    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    old, _ = certs.rotate_ca({}, "fraud skiff CA", start)  # made before constraints: none
    assert certs.ca_constraints(old.current.cert_pem) is None

    upgraded = start + 10 * DAY  # far from two thirds of its lifetime
    announced, step = certs.rotate_ca(old.secret_data(), "fraud skiff CA", upgraded, permitted=PERMITTED)
    assert step is certs.CAStep.ANNOUNCED
    assert announced.current == old.current  # the old CA still signs until clients had the bundle
    assert announced.next is not None
    assert certs.ca_constraints(announced.next.cert_pem) == tuple(PERMITTED)
    during = upgraded + certs.CA_OVERLAP - DAY
    kept = certs.rotate_ca(announced.secret_data(), "fraud skiff CA", during, permitted=PERMITTED)
    assert kept == (announced, certs.CAStep.KEPT)

    promoted_at = upgraded + certs.CA_OVERLAP + DAY
    promoted, step = certs.rotate_ca(announced.secret_data(), "fraud skiff CA", promoted_at, permitted=PERMITTED)
    assert (step, promoted.current, promoted.previous) == (certs.CAStep.PROMOTED, announced.next, old.current.cert_pem)
    steady = certs.rotate_ca(promoted.secret_data(), "fraud skiff CA", promoted_at + DAY, permitted=PERMITTED)
    assert steady == (promoted, certs.CAStep.KEPT)  # constrained now: no further rotation

    # The old CA's leaf was replaced at the switch; it stays trusted only as long as such a leaf could be valid.
    # (It would otherwise stay for the rest of its year.)
    later = promoted_at + certs.SERVER_LIFETIME
    cleaned, _ = certs.rotate_ca(promoted.secret_data(), "fraud skiff CA", later, permitted=PERMITTED)
    assert cleaned.previous is None
    assert certs.read_certificate(old.current.cert_pem).not_after > later


def test_an_announced_successor_without_the_constraints_is_announced_again() -> None:
    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    chain, _ = certs.rotate_ca({}, "fraud skiff CA", start)
    announced, _ = certs.rotate_ca(chain.secret_data(), "fraud skiff CA", chain_renew_at(chain) + DAY)
    assert announced.next is not None
    assert certs.ca_constraints(announced.next.cert_pem) is None
    again, step = certs.rotate_ca(announced.secret_data(), "fraud skiff CA", chain_renew_at(chain) + 2 * DAY,
                                  permitted=PERMITTED)  # fmt: skip
    assert step is certs.CAStep.ANNOUNCED
    assert again.next is not None
    assert certs.ca_constraints(again.next.cert_pem) == tuple(PERMITTED)


def chain_renew_at(chain: certs.CAChain) -> datetime.datetime:
    return certs.read_certificate(chain.current.cert_pem).renew_at
