"""TLS in a reconcile: read the Secrets spec.tls.mode uses (`observe_tls`), decide what the pods mount and which
Secrets or Certificate to write (`plan_tls`, no I/O: a `TLSWrite` decision each); skiff_operator.manifests renders
them first.

Level-based like the rest of the reconcile: every run reads what exists, decides, and applies only what must
change. SelfSigned issues a certificate only when `certs.decide_renewal` says so (missing, past 2/3 of its
lifetime, SAN set or CA changed), never on every run; the periodic resync reaches the expiry-driven case.
No message, event or status produced here carries key material.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from skiff_operator import certs, names
from skiff_operator.conditions import EventType, Problem, Reason, StatusEvent
from skiff_operator.kinds import CERTIFICATE, SECRET
from skiff_operator.observed import Holder, Occupant, StoredSecret
from skiff_operator.ownership import (
    CERTIFICATE_NAME_ANNOTATION,
    foreign_holder,
    name_conflict_message,
    refused_secret_message,
)
from skiff_operator.spec import InferenceModel, TLSMode
from skiff_operator.status import WRITTEN_AS_NULL

CERTIFICATE_CRD = CERTIFICATE.crd_name
CERTIFICATE_CRD_VERSION = CERTIFICATE.version
CERT_MANAGER_INSTALL = "https://cert-manager.io/docs/installation/"


@dataclass(frozen=True)
class CASecret:
    """SelfSigned: write the CA chain's Secret (Opaque: ca.crt, ca.key, and while it rotates next.crt, next.key,
    previous.crt) with `data`."""

    name: str
    data: Mapping[str, bytes]
    kind: str = SECRET.kind


@dataclass(frozen=True)
class ServerSecret:
    """SelfSigned: write the newly issued server certificate's Secret (kubernetes.io/tls: tls.crt, tls.key and
    ca.crt, the CA bundle clients trust)."""

    name: str
    server: certs.KeyPair
    ca_bundle: bytes
    kind: str = SECRET.kind


@dataclass(frozen=True)
class CertificateRequest:
    """CertManager: apply the Certificate that has cert-manager issue `dns_names` into the Secret `name`."""

    name: str
    dns_names: tuple[str, ...]
    kind: str = CERTIFICATE.kind


# What the TLS step decided to write; skiff_operator.manifests.render_tls renders each (render/tls.py).
TLSWrite = CASecret | ServerSecret | CertificateRequest


def tls_dns_names(model: InferenceModel) -> list[str]:
    """The certificate's SAN set: the model Service short, namespaced, .svc and .svc.cluster.local, each version
    Service .svc and .svc.cluster.local (inside the CA's NameConstraints, `ca_dns_subtrees`)."""
    name = model.ref.name
    versions = [names.version_service_name(name, v.name) for v in model.spec.versions]
    return certs.service_dns_names(names.model_service_name(name), versions, model.ref.namespace)


def ca_dns_subtrees(model: InferenceModel) -> list[str]:
    """The DNS subtrees the model's SelfSigned CA may sign for: fixed for the model's lifetime, so adding a
    version never needs a new CA."""
    return certs.permitted_dns_subtrees(names.model_service_name(model.ref.name), model.ref.namespace)


class TLSCluster(Protocol):
    """What reading TLS needs from the API server (kube.Kube in production, a fake in tests)."""

    async def read_secret(self, namespace: str, name: str) -> StoredSecret | None: ...

    async def crd_serves(self, name: str, version: str) -> bool: ...

    async def read_controller(self, api_version: str, kind: str, namespace: str, name: str) -> Holder | None: ...


@dataclass(frozen=True)
class TLSObserved:
    """What exists for the model's TLS: the Secrets its mode reads (None: absent), and for CertManager whether the
    Certificate CRD is served and who controls an existing Certificate."""

    secrets: Mapping[str, StoredSecret | None] = field(default_factory=dict)
    certificate_crd_served: bool = False
    certificate: Holder | None = None


@dataclass(frozen=True)
class TLSState:
    """Where the model's TLS stands: the Secret the pods mount, its certificate, or the problem holding it, and
    what to write (Secrets, a Certificate: applied before anything else, even while a problem holds the rest)."""

    mode: TLSMode
    secret_name: str | None = None
    certificate: certs.CertificateInfo | None = None
    problem: Problem | None = None
    events: tuple[StatusEvent, ...] = ()
    writes: tuple[TLSWrite, ...] = ()
    ca_bundle: bytes | None = None  # ca.crt of the Secret the pods mount, as it is once `writes` are applied

    @property
    def applied(self) -> tuple[str, ...]:
        """The "Kind/name" of what this step writes."""
        return tuple(f"{w.kind}/{w.name}" for w in self.writes)


async def observe_tls(model: InferenceModel, cluster: TLSCluster) -> TLSObserved:
    """Reads what spec.tls.mode uses: nothing when Disabled."""
    tls = model.spec.tls
    namespace = model.ref.namespace
    wanted: list[str] = []
    served, certificate = False, None
    if tls.mode is TLSMode.SELF_SIGNED:
        wanted = [names.tls_ca_secret_name(model.ref.name), names.tls_secret_name(model.ref.name)]
    elif tls.mode is TLSMode.SECRET and tls.secret_name:
        wanted = [tls.secret_name]
    elif tls.mode is TLSMode.CERT_MANAGER:
        secret_name = names.tls_secret_name(model.ref.name)
        served = await cluster.crd_serves(CERTIFICATE_CRD, CERTIFICATE_CRD_VERSION)
        if served:
            certificate = await cluster.read_controller(
                CERTIFICATE.api_version, CERTIFICATE.kind, namespace, secret_name
            )
            wanted = [secret_name]
    if tls.mode is not TLSMode.DISABLED and tls.client_ca_secret_name:
        wanted.append(tls.client_ca_secret_name)
    secrets = {name: await cluster.read_secret(namespace, name) for name in dict.fromkeys(wanted)}
    return TLSObserved(secrets, served, certificate)


def plan_tls(model: InferenceModel, observed: TLSObserved, now: datetime.datetime) -> TLSState:
    """Decides the model's TLS from what exists. A problem in the returned state means the Deployments must not
    change (their pods could not start, or would serve a bad certificate). SelfSigned issues keys here (no I/O)."""
    tls = model.spec.tls
    if tls.mode is TLSMode.DISABLED:
        return TLSState(TLSMode.DISABLED)
    if tls.mode is TLSMode.SELF_SIGNED:
        state = _self_signed(model, observed, now)
    elif tls.mode is TLSMode.SECRET:
        state = _user_secret(model, observed, now)
    else:
        state = _cert_manager(model, observed, now)
    if state.problem is None and tls.client_ca_secret_name:
        problem = _client_ca_problem(model, observed, tls.client_ca_secret_name)
        if problem is not None:
            state = dataclasses.replace(state, problem=problem)
    return state


@dataclass(frozen=True)
class TLSStatus:
    """status.tls: the mode, the Secret and what its certificate says (never key material); a field with nothing
    to say is written as null, which clears what an earlier reconcile wrote."""

    mode: TLSMode
    secret_name: str | None = field(metadata=WRITTEN_AS_NULL)
    not_after: datetime.datetime | None = field(metadata=WRITTEN_AS_NULL)
    dns_names: tuple[str, ...] | None = field(metadata=WRITTEN_AS_NULL)


def tls_status(state: TLSState) -> TLSStatus:
    info = state.certificate
    return TLSStatus(
        state.mode,
        state.secret_name,
        info.not_after if info else None,
        tuple(info.dns_names) if info else None,
    )


def _self_signed(model: InferenceModel, observed: TLSObserved, now: datetime.datetime) -> TLSState:
    secret_name = names.tls_secret_name(model.ref.name)
    ca_name = names.tls_ca_secret_name(model.ref.name)
    events: list[StatusEvent] = []
    writes: list[TLSWrite] = []

    stored_ca = observed.secrets.get(ca_name)
    stored_server = observed.secrets.get(secret_name)
    conflict = _conflict(model, [(SECRET.kind, ca_name, stored_ca), (SECRET.kind, secret_name, stored_server)])
    if conflict is not None:
        return TLSState(TLSMode.SELF_SIGNED, secret_name, problem=conflict)
    # A common name is at most 64 characters: the model's (at most 42), not the namespace's (up to 63).
    stored_chain = stored_ca.data if stored_ca else {}
    common_name = f"{model.ref.name} skiff CA"
    chain, step = certs.rotate_ca(stored_chain, common_name, now, permitted=ca_dns_subtrees(model))
    if stored_ca is None or chain.secret_data() != dict(stored_ca.data):
        writes.append(CASecret(ca_name, chain.secret_data()))
    events += _ca_events(step, chain, ca_name, secret_name)
    ca, bundle = chain.current, chain.bundle()

    wanted = tls_dns_names(model)
    stored = stored_server.data if stored_server else {}
    decision = certs.decide_renewal(stored.get(certs.TLS_CERT_KEY), wanted, now, certs.ca_fingerprint(ca.cert_pem))
    if not decision.renew:
        problems = certs.check_tls_secret(stored, now)
        if stored.get(certs.CA_CERT_KEY) != bundle:
            problems.append(f"{certs.CA_CERT_KEY!r} is not the current CA bundle")
        if problems:
            decision = certs.RenewDecision(True, certs.RenewReason.UNREADABLE, "; ".join(problems))

    certificate = stored.get(certs.TLS_CERT_KEY, b"")
    if decision.renew:
        server = certs.issue_server_certificate(ca, wanted, now)
        writes.append(ServerSecret(secret_name, server, bundle))
        certificate = server.cert_pem
        info = certs.read_certificate(certificate)
        issued = decision.reason is certs.RenewReason.MISSING
        events.append(
            StatusEvent(
                EventType.NORMAL,
                Reason.CERTIFICATE_ISSUED if issued else Reason.CERTIFICATE_RENEWED,
                f"{'issued' if issued else 'renewed'} the certificate in Secret {secret_name} "
                f"({decision.reason}: {decision.message}) for {len(info.dns_names)} DNS names, "
                f"valid until {_timestamp(info.not_after)}",
            )
        )
    return TLSState(
        TLSMode.SELF_SIGNED,
        secret_name,
        certs.read_certificate(certificate),
        events=tuple(events),
        writes=tuple(writes),
        ca_bundle=bundle,
    )


def _ca_events(step: certs.CAStep, chain: certs.CAChain, ca_name: str, secret_name: str) -> list[StatusEvent]:
    """What a client that trusts the `ca.crt` of `secret_name` must know about a CA change."""
    until = _timestamp(certs.read_certificate(chain.current.cert_pem).not_after)
    if step is certs.CAStep.ISSUED:
        return [
            StatusEvent(
                EventType.NORMAL, Reason.CERTIFICATE_ISSUED, f"issued CA in Secret {ca_name}, valid until {until}"
            )
        ]
    if step is certs.CAStep.ANNOUNCED and chain.next is not None:
        switch = certs.read_certificate(chain.next.cert_pem).not_before + certs.CLOCK_SKEW + certs.CA_OVERLAP
        return [
            StatusEvent(
                EventType.NORMAL,
                Reason.CA_ROTATION_STARTED,
                f"the CA in Secret {ca_name} is due for renewal (two thirds of its lifetime, or made without this "
                f"model's NameConstraints): its successor is now in ca.crt of Secret "
                f"{secret_name}, next to it; clients must trust that bundle before {_timestamp(switch)}, when the "
                "successor starts signing",
            )
        ]
    if step is certs.CAStep.PROMOTED:
        return [
            StatusEvent(
                EventType.NORMAL,
                Reason.CA_ROTATED,
                f"the new CA in Secret {ca_name} (valid until {until}) signs from now on; the old one stays in ca.crt "
                f"of Secret {secret_name} until no certificate it signed can be valid",
            )
        ]
    return []


def _user_secret(model: InferenceModel, observed: TLSObserved, now: datetime.datetime) -> TLSState:
    secret_name = model.spec.tls.secret_name
    assert secret_name is not None  # parse_tls requires it in mode Secret
    namespace = model.ref.namespace
    secret = observed.secrets.get(secret_name)
    if secret is None:
        return TLSState(
            TLSMode.SECRET,
            secret_name,
            problem=Problem(
                Reason.TLS_SECRET_MISSING,
                f"spec.tls.secretName: Secret {secret_name!r} not found in namespace {namespace}; create a "
                "kubernetes.io/tls Secret with tls.crt and tls.key (kubectl create secret tls), or use tls.mode "
                "SelfSigned",
            ),
        )
    refused = refused_secret_message(secret, f"spec.tls.secretName: Secret {secret_name!r}")
    if refused is not None:
        return TLSState(TLSMode.SECRET, secret_name, problem=Problem(Reason.SECRET_REFUSED, refused))
    data = secret.data
    problems = certs.check_tls_secret(data, now)
    if problems:
        return TLSState(
            TLSMode.SECRET,
            secret_name,
            problem=Problem(
                Reason.TLS_SECRET_INVALID, f"spec.tls.secretName: Secret {secret_name!r}: {'; '.join(problems)}"
            ),
        )
    certificate = certs.read_certificate(data[certs.TLS_CERT_KEY])
    return TLSState(TLSMode.SECRET, secret_name, certificate, ca_bundle=data.get(certs.CA_CERT_KEY))


def _cert_manager(model: InferenceModel, observed: TLSObserved, now: datetime.datetime) -> TLSState:
    secret_name = names.tls_secret_name(model.ref.name)
    if not observed.certificate_crd_served:
        return TLSState(
            TLSMode.CERT_MANAGER,
            secret_name,
            problem=Problem(
                Reason.CERT_MANAGER_NOT_INSTALLED,
                f"tls.mode CertManager needs cert-manager, and the {CERTIFICATE_CRD} CRD is not installed: install "
                f"cert-manager ({CERT_MANAGER_INSTALL}), or use tls.mode SelfSigned",
            ),
        )
    certificate = observed.certificate
    secret = observed.secrets.get(secret_name)
    # cert-manager writes the Secret named in the Certificate, whoever made it: one it did not issue for this
    # model's Certificate (no matching annotation) would be taken over through it.
    foreign_secret = secret is not None and secret.annotations.get(CERTIFICATE_NAME_ANNOTATION) != secret_name
    taken = []
    if certificate is not None and foreign_holder(certificate, model.ref.uid):
        taken.append(Occupant(CERTIFICATE.kind, secret_name, certificate))
    if foreign_secret and secret is not None:
        taken.append(Occupant(SECRET.kind, secret_name, secret.holder))
    if taken:
        problem = Problem(Reason.NAME_CONFLICT, name_conflict_message(taken))
        return TLSState(TLSMode.CERT_MANAGER, secret_name, problem=problem)
    writes = (CertificateRequest(secret_name, tuple(tls_dns_names(model))),)
    stored = secret.data if secret else {}
    # Only what the pods need: a chain through an intermediate would fail a direct check against ca.crt.
    problems = certs.check_tls_secret({k: v for k, v in stored.items() if k != certs.CA_CERT_KEY}, now)
    if problems:
        issuer = model.spec.tls.issuer_ref
        assert issuer is not None  # parse_tls requires it in mode CertManager
        return TLSState(
            TLSMode.CERT_MANAGER,
            secret_name,
            problem=Problem(
                Reason.CERTIFICATE_PENDING,
                f"waiting for cert-manager to issue Certificate {secret_name} (issuer {issuer.kind.value} "
                f"{issuer.name}) into Secret {secret_name}: {'; '.join(problems)}",
            ),
            writes=writes,
        )
    return TLSState(
        TLSMode.CERT_MANAGER,
        secret_name,
        certs.read_certificate(stored[certs.TLS_CERT_KEY]),
        writes=writes,
        ca_bundle=stored.get(certs.CA_CERT_KEY),
    )


def _client_ca_problem(model: InferenceModel, observed: TLSObserved, secret_name: str) -> Problem | None:
    namespace = model.ref.namespace
    secret = observed.secrets.get(secret_name)
    where = f"spec.tls.clientCASecretName: Secret {secret_name!r}"
    if secret is None:
        return Problem(
            Reason.TLS_SECRET_MISSING,
            f"{where} not found in namespace {namespace}; create it with the client CA in key {certs.CA_CERT_KEY!r}",
        )
    refused = refused_secret_message(secret, where)
    if refused is not None:
        return Problem(Reason.SECRET_REFUSED, refused)
    try:
        certs.read_certificate(secret.data.get(certs.CA_CERT_KEY) or b"")
    except ValueError:
        return Problem(
            Reason.TLS_SECRET_INVALID, f"{where}: key {certs.CA_CERT_KEY!r} is missing or not a PEM certificate"
        )
    return None


def _conflict(model: InferenceModel, written: list[tuple[str, str, StoredSecret | None]]) -> Problem | None:
    """NameConflict for the Secrets this step writes that exist and are not controlled by the model."""
    taken = [
        Occupant(kind, name, stored.holder)
        for kind, name, stored in written
        if stored is not None and foreign_holder(stored.holder, model.ref.uid)
    ]
    return Problem(Reason.NAME_CONFLICT, name_conflict_message(taken)) if taken else None


def _timestamp(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
