"""Parses spec.podTemplate (what users may add to the runtime pods) into frozen values, refusing what would break
Pod Security "restricted" or reach the node; skiff_operator.render.pod_template merges it under the operator's
fields."""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from skiff_operator.conditions import Reason
from skiff_operator.errors import SpecError
from skiff_operator.spec.grammar import _DNS1123_LABEL, _shown, is_object_name

WHERE = "spec.podTemplate"

# The volume sources a user volume may have: each stays inside the pod's namespace (Pod Security "restricted"
# allows these, and csi/ephemeral, which Skiff does not offer). hostPath and every other node- or cluster-reaching
# source is absent from the CRD's schema, so the API server refuses it (strict field validation) or drops it, and a
# volume left with no source is refused below and by the CRD's rule.
VOLUME_SOURCES = ("configMap", "secret", "emptyDir", "persistentVolumeClaim", "projected", "downwardAPI")
# Capabilities a sidecar may add (Pod Security "restricted": NET_BIND_SERVICE only).
ALLOWED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})


class SpreadDomain(enum.StrEnum):
    """spec.podTemplate.spreadAcross: what a version's pods are spread over (maxSkew 1, ScheduleAnyway)."""

    NODES = "Nodes"
    ZONES = "Zones"


# SpreadDomain -> the node label it spreads over.
SPREAD_TOPOLOGY_KEYS = {SpreadDomain.NODES: "kubernetes.io/hostname", SpreadDomain.ZONES: "topology.kubernetes.io/zone"}


@dataclass(frozen=True)
class Document:
    """A part of the pod spec the CRD's schema already typed and bounded, kept as canonical JSON (frozen)."""

    json: str

    @classmethod
    def of(cls, value: Any) -> Document:
        return cls(json.dumps(value, sort_keys=True, separators=(",", ":")))

    def to_manifest(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.json)
        return loaded


@dataclass(frozen=True)
class Named:
    """A named entry of a list the pod spec merges by name (env, volumes, containers) with its whole document."""

    name: str
    document: Document


@dataclass(frozen=True)
class Mount:
    """A volumeMount of the runtime container: the user volume it names and where."""

    name: str
    mount_path: str
    document: Document


@dataclass(frozen=True)
class PodTemplate:
    """spec.podTemplate: added to every version's pods; the operator's own fields win (and say so)."""

    service_account_name: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    env: tuple[Named, ...] = ()
    env_from: tuple[Document, ...] = ()
    volumes: tuple[Named, ...] = ()
    volume_mounts: tuple[Mount, ...] = ()
    sidecars: tuple[Named, ...] = ()
    topology_spread_constraints: tuple[Document, ...] = ()
    spread_across: tuple[SpreadDomain, ...] = ()
    security_context: Document | None = None  # pod-level additions: supplementalGroups, fsGroupChangePolicy

    @property
    def empty(self) -> bool:
        return self == PodTemplate()


def parse_pod_template(raw: Any, default_spread: tuple[SpreadDomain, ...] = ()) -> PodTemplate:
    """spec.podTemplate; `default_spread` (the operator's --default-spread-across) applies when the model sets
    neither spreadAcross nor topologySpreadConstraints."""
    body = _mapping({} if raw is None else raw, WHERE)
    volumes = tuple(_parse_volume(v) for v in _list(body, "volumes"))
    _unique([v.name for v in volumes], f"{WHERE}.volumes[].name")
    volume_names = {v.name for v in volumes}
    mounts = tuple(_parse_mount(m, volume_names, f"{WHERE}.volumeMounts[]") for m in _list(body, "volumeMounts"))
    _unique([m.mount_path for m in mounts], f"{WHERE}.volumeMounts[].mountPath")
    env = tuple(_parse_env(e, f"{WHERE}.env[]") for e in _list(body, "env"))
    _unique([e.name for e in env], f"{WHERE}.env[].name")
    sidecars = tuple(_parse_sidecar(c, volume_names) for c in _list(body, "sidecars"))
    _unique([c.name for c in sidecars], f"{WHERE}.sidecars[].name")
    constraints = tuple(_parse_spread_constraint(c) for c in _list(body, "topologySpreadConstraints"))
    spread = tuple(_spread_domain(d) for d in _list(body, "spreadAcross"))
    _unique([str(d) for d in spread], f"{WHERE}.spreadAcross")
    if "spreadAcross" not in body and not constraints:
        spread = default_spread
    context = body.get("securityContext")
    account = body.get("serviceAccountName")
    if account is not None and not is_object_name(account):
        raise SpecError(
            Reason.INVALID_SPEC, f"{WHERE}.serviceAccountName {_shown(str(account))} must name a ServiceAccount"
        )
    return PodTemplate(
        service_account_name=account or None,
        labels=_string_map(body.get("labels", {}), f"{WHERE}.labels"),
        annotations=_string_map(body.get("annotations", {}), f"{WHERE}.annotations"),
        env=env,
        env_from=tuple(Document.of(_mapping(e, f"{WHERE}.envFrom[]")) for e in _list(body, "envFrom")),
        volumes=volumes,
        volume_mounts=mounts,
        sidecars=sidecars,
        topology_spread_constraints=constraints,
        spread_across=spread,
        security_context=None if not context else Document.of(_mapping(context, f"{WHERE}.securityContext")),
    )


def parse_spread_domains(values: Sequence[str], where: str) -> tuple[SpreadDomain, ...]:
    """A list of Nodes/Zones (the operator's --default-spread-across), in order, without repeats."""
    domains = tuple(_spread_domain(v, where) for v in values)
    _unique([str(d) for d in domains], where)
    return domains


def _spread_domain(value: Any, where: str = f"{WHERE}.spreadAcross[]") -> SpreadDomain:
    try:
        return SpreadDomain(value)
    except ValueError as error:
        choices = ", ".join(d.value for d in SpreadDomain)
        raise SpecError(Reason.INVALID_SPEC, f"{where} {_shown(str(value))}: give one of {choices}") from error


def _parse_volume(raw: Any) -> Named:
    volume = _mapping(raw, f"{WHERE}.volumes[]")
    name = _label(volume.get("name"), f"{WHERE}.volumes[].name")
    sources = [key for key in volume if key != "name"]
    allowed = [key for key in sources if key in VOLUME_SOURCES]
    if len(sources) != 1 or len(allowed) != 1:
        refused = sorted(set(sources) - set(VOLUME_SOURCES))
        why = f" ({', '.join(refused)} is not allowed: it reaches the node or the cluster)" if refused else ""
        raise SpecError(
            Reason.INVALID_SPEC,
            f"{WHERE}.volumes[{name}] needs exactly one source of {', '.join(VOLUME_SOURCES)}{why}; volumes that reach "
            "the node, such as hostPath, are never allowed",
        )
    return Named(name, Document.of(volume))


def _parse_mount(raw: Any, volume_names: set[str], where: str) -> Mount:
    mount = _mapping(raw, where)
    name = _label(mount.get("name"), f"{where}.name")
    if name not in volume_names:
        raise SpecError(
            Reason.INVALID_SPEC,
            f"{where} names volume {name!r}, which spec.podTemplate.volumes does not list: mounts may name only "
            "the volumes of spec.podTemplate.volumes",
        )
    path = mount.get("mountPath")
    if not isinstance(path, str) or not path.startswith("/") or ".." in path.split("/"):
        raise SpecError(Reason.INVALID_SPEC, f"{where}.mountPath of {name!r} must be an absolute path without '..'")
    return Mount(name, path.rstrip("/") or "/", Document.of(mount))


def _parse_env(raw: Any, where: str) -> Named:
    env = _mapping(raw, where)
    name = env.get("name")
    if not isinstance(name, str) or not name:
        raise SpecError(Reason.INVALID_SPEC, f"{where}.name must be a non-empty string")
    if ("value" in env) == ("valueFrom" in env):
        raise SpecError(Reason.INVALID_SPEC, f"{where} {name!r} needs either value or valueFrom")
    return Named(name, Document.of(env))


def _parse_sidecar(raw: Any, volume_names: set[str]) -> Named:
    where = f"{WHERE}.sidecars[]"
    container = _mapping(raw, where)
    name = _label(container.get("name"), f"{where}.name")
    where = f"{WHERE}.sidecars[{name}]"
    image = container.get("image")
    if not isinstance(image, str) or not image:
        raise SpecError(Reason.INVALID_SPEC, f"{where}.image must be a non-empty string")
    for mount in _list(container, "volumeMounts", where):
        _parse_mount(mount, volume_names, f"{where}.volumeMounts[]")
    env = [_parse_env(e, f"{where}.env[]") for e in _list(container, "env", where)]
    _unique([e.name for e in env], f"{where}.env[].name")
    check_restricted(_mapping(container.get("securityContext", {}), f"{where}.securityContext"), where)
    return Named(name, Document.of(container))


def check_restricted(context: Mapping[str, Any], where: str) -> None:
    """Refuses a sidecar securityContext that Pod Security "restricted" forbids, naming the field and the fix."""
    refusals = []
    if context.get("privileged") is True:
        refusals.append("privileged: true (remove it)")
    if context.get("allowPrivilegeEscalation") is True:
        refusals.append("allowPrivilegeEscalation: true (remove it)")
    if context.get("runAsUser") == 0:
        refusals.append("runAsUser: 0 (run as a non-root user)")
    if context.get("runAsNonRoot") is False:
        refusals.append("runAsNonRoot: false (remove it)")
    added = _mapping(context.get("capabilities", {}), f"{where}.securityContext.capabilities").get("add", [])
    extra = sorted(set(added) - ALLOWED_CAPABILITIES)
    if extra:
        refusals.append(f"capabilities.add {', '.join(map(str, extra))} (only NET_BIND_SERVICE may be added)")
    if refusals:
        raise SpecError(
            Reason.INVALID_SPEC,
            f"{where}.securityContext asks for what Pod Security 'restricted' forbids: {'; '.join(refusals)}",
        )


def _parse_spread_constraint(raw: Any) -> Document:
    where = f"{WHERE}.topologySpreadConstraints[]"
    constraint = _mapping(raw, where)
    for key in ("maxSkew", "topologyKey", "whenUnsatisfiable"):
        if key not in constraint:
            raise SpecError(Reason.INVALID_SPEC, f"{where}.{key} is required")
    return Document.of(constraint)


def _label(value: Any, where: str) -> str:
    if not isinstance(value, str) or len(value) > 63 or _DNS1123_LABEL.fullmatch(value) is None:
        raise SpecError(Reason.INVALID_SPEC, f"{where} {_shown(str(value))} must be a DNS-1123 label (at most 63)")
    return value


def _unique(values: Sequence[str], where: str) -> None:
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise SpecError(Reason.INVALID_SPEC, f"{where} must not repeat (repeated: {', '.join(repeated)})")


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SpecError(Reason.INVALID_SPEC, f"{where} must be an object")
    return value


def _list(body: Mapping[str, Any], key: str, where: str = WHERE) -> Sequence[Any]:
    value = body.get(key, [])
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise SpecError(Reason.INVALID_SPEC, f"{where}.{key} must be a list")
    return value


def _string_map(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    pairs = _mapping(value, where).items()
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in pairs):
        raise SpecError(Reason.INVALID_SPEC, f"{where} must map strings to strings")
    return tuple(sorted(pairs))
