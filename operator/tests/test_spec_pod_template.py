"""spec.pod_template: what spec.podTemplate may hold, and the clear refusal of what breaks "restricted"."""

from __future__ import annotations

from typing import Any

import pytest

from skiff_operator.errors import SpecError
from skiff_operator.spec import SpreadDomain, parse_spread_domains
from skiff_operator.spec.pod_template import parse_pod_template


def sidecar(**context: Any) -> dict[str, Any]:
    return {"sidecars": [{"name": "agent", "image": "vault:1.17", "securityContext": context}]}


@pytest.mark.parametrize(
    ("context", "message"),
    [
        ({"privileged": True}, "privileged: true"),
        ({"allowPrivilegeEscalation": True}, "allowPrivilegeEscalation: true"),
        ({"runAsUser": 0}, "runAsUser: 0"),
        ({"runAsNonRoot": False}, "runAsNonRoot: false"),
        ({"capabilities": {"add": ["SYS_ADMIN"]}}, "capabilities.add SYS_ADMIN"),
    ],
)
def test_a_sidecar_asking_for_privilege_is_refused_by_name(context: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=rf"sidecars\[agent\]\.securityContext.*{message}"):
        parse_pod_template(sidecar(**context))


@pytest.mark.parametrize(
    "context",
    [{}, {"runAsUser": 1337}, {"privileged": False}, {"capabilities": {"add": ["NET_BIND_SERVICE"]}}],
)
def test_a_restricted_sidecar_is_accepted(context: dict[str, Any]) -> None:
    assert [s.name for s in parse_pod_template(sidecar(**context)).sidecars] == ["agent"]


@pytest.mark.parametrize(
    "volume",
    [
        {"name": "host", "hostPath": {"path": "/var/run/docker.sock"}},
        {"name": "bare"},  # what a pruned hostPath leaves
        {"name": "two", "emptyDir": {}, "secret": {"secretName": "s"}},
    ],
)
def test_a_volume_with_no_allowed_source_or_a_node_source_is_refused(volume: dict[str, Any]) -> None:
    with pytest.raises(SpecError, match=r"needs exactly one source of configMap.*hostPath, are never allowed"):
        parse_pod_template({"volumes": [volume]})


@pytest.mark.parametrize(
    "volume",
    [
        {"name": "cfg", "configMap": {"name": "tuning"}},
        {"name": "creds", "secret": {"secretName": "s3"}},
        {"name": "scratch", "emptyDir": {"medium": "Memory"}},
        {"name": "data", "persistentVolumeClaim": {"claimName": "features"}},
        {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "t", "audience": "sts"}}]}},
        {"name": "info", "downwardAPI": {"items": []}},
    ],
)
def test_each_namespaced_volume_source_is_accepted(volume: dict[str, Any]) -> None:
    assert [v.name for v in parse_pod_template({"volumes": [volume]}).volumes] == [volume["name"]]


def test_a_mount_must_name_a_volume_of_the_pod_template() -> None:
    volumes = [{"name": "cfg", "configMap": {"name": "tuning"}}]
    with pytest.raises(SpecError, match=r"names volume 'model'.*may name only the volumes of spec.podTemplate"):
        parse_pod_template({"volumes": volumes, "volumeMounts": [{"name": "model", "mountPath": "/x"}]})
    parsed = parse_pod_template({"volumes": volumes, "volumeMounts": [{"name": "cfg", "mountPath": "/etc/cfg/"}]})
    assert parsed.volume_mounts[0].mount_path == "/etc/cfg"


def test_a_sidecar_mount_must_name_a_volume_of_the_pod_template() -> None:
    body = {"sidecars": [{"name": "a", "image": "i", "volumeMounts": [{"name": "tls", "mountPath": "/k"}]}]}
    with pytest.raises(SpecError, match=r"sidecars\[a\]\.volumeMounts\[\] names volume 'tls'"):
        parse_pod_template(body)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}, r"env\[\]\.name must not repeat"),
        ({"env": [{"name": "A"}]}, "'A' needs either value or valueFrom"),
        ({"serviceAccountName": "../admin"}, "must name a ServiceAccount"),
        ({"spreadAcross": ["Racks"]}, "give one of Nodes, Zones"),
        ({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "k"}]}, "whenUnsatisfiable is required"),
    ],
)
def test_a_malformed_pod_template_says_what_to_fix(body: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_pod_template(body)


def test_spread_domains_of_the_command_line_are_checked() -> None:
    assert parse_spread_domains(["Nodes", "Zones"], "--x") == (SpreadDomain.NODES, SpreadDomain.ZONES)
    with pytest.raises(SpecError, match="--x must not repeat"):
        parse_spread_domains(["Nodes", "Nodes"], "--x")
