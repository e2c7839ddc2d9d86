"""Merges spec.podTemplate under the operator's pod: the operator's fields win, and every user field they displace
is named (the PodTemplateOverridden Event), never dropped unsaid."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skiff_operator.spec import PodTemplate
from skiff_operator.spec.pod_template import SPREAD_TOPOLOGY_KEYS

WHERE = "spec.podTemplate"


@dataclass(frozen=True)
class MergedPod:
    """The pod template's labels, annotations and spec with the user's additions, and what was not applied."""

    labels: dict[str, str]
    annotations: dict[str, str]
    spec: dict[str, Any]
    overridden: tuple[str, ...]  # the user's fields the operator's displaced, as spec paths


def merge_pod_template(
    template: PodTemplate,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    pod: Mapping[str, Any],
    selector: Mapping[str, str],
    security_context: Mapping[str, Any],
) -> MergedPod:
    """`labels`, `annotations`, `pod` (its first container the runtime's): the operator's; `selector`: the
    version's pod labels a spread constraint counts by default; `security_context`: the container security context
    every sidecar runs with (the operator's, over the sidecar's own)."""
    spec = copy.deepcopy(dict(pod))
    if template.empty:
        return MergedPod(dict(labels), dict(annotations), spec, ())
    overridden: list[str] = []
    merged_labels = _merge_map(template.labels, labels, f"{WHERE}.labels", overridden)
    merged_annotations = _merge_map(template.annotations, annotations, f"{WHERE}.annotations", overridden)
    if template.service_account_name:
        spec["serviceAccountName"] = template.service_account_name
    if template.security_context is not None:
        user = template.security_context.to_manifest()
        operator = spec.get("securityContext", {})
        overridden += [f"{WHERE}.securityContext.{k}" for k in sorted(user) if k in operator and user[k] != operator[k]]
        spec["securityContext"] = {**user, **operator}
    spread = _spread_constraints(template, selector)
    if spread:
        spec["topologySpreadConstraints"] = spread
    # Volumes: a user volume whose name the operator uses is not applied, nor is any mount of it (it would mount
    # the operator's volume of that name instead: the TLS key, the token).
    taken = {v["name"] for v in spec.get("volumes", [])}
    dropped = {v.name for v in template.volumes if v.name in taken}
    overridden += [f"{WHERE}.volumes[{name}]" for name in sorted(dropped)]
    spec["volumes"] = [
        *spec.get("volumes", []),
        *(v.document.to_manifest() for v in template.volumes if v.name not in dropped),
    ]
    runtime = spec["containers"][0]
    _merge_runtime(template, runtime, dropped, overridden)
    containers = {c["name"] for c in (*spec["containers"], *spec.get("initContainers", []))}
    for sidecar in template.sidecars:
        if sidecar.name in containers:
            overridden.append(f"{WHERE}.sidecars[{sidecar.name}]")
            continue
        spec["containers"].append(_sidecar(sidecar.document.to_manifest(), security_context, dropped, overridden))
    return MergedPod(merged_labels, merged_annotations, spec, tuple(overridden))


def _merge_map(
    user: tuple[tuple[str, str], ...], operator: Mapping[str, str], where: str, overridden: list[str]
) -> dict[str, str]:
    overridden += [f"{where}[{k}]" for k, v in user if k in operator and operator[k] != v]
    return {**dict(user), **operator}


def _merge_runtime(template: PodTemplate, runtime: dict[str, Any], dropped: set[str], overridden: list[str]) -> None:
    """The user's env, envFrom and volumeMounts on the runtime container, under the operator's."""
    names = {e["name"] for e in runtime.get("env", [])}
    for env in template.env:
        if env.name in names:
            overridden.append(f"{WHERE}.env[{env.name}]")
        else:
            runtime.setdefault("env", []).append(env.document.to_manifest())
    if template.env_from:  # the container's env (the operator's) wins over envFrom, as Kubernetes defines it
        runtime["envFrom"] = [e.to_manifest() for e in template.env_from]
    paths = {m["mountPath"].rstrip("/") for m in runtime.get("volumeMounts", [])}
    for mount in template.volume_mounts:
        if mount.mount_path in paths or mount.name in dropped:
            overridden.append(f"{WHERE}.volumeMounts[{mount.mount_path}]")
        else:
            runtime.setdefault("volumeMounts", []).append(mount.document.to_manifest())


def _sidecar(
    container: dict[str, Any], security_context: Mapping[str, Any], dropped: set[str], overridden: list[str]
) -> dict[str, Any]:
    name = container["name"]
    user = container.get("securityContext", {})
    for key in sorted(user):
        if key in security_context and key != "capabilities" and user[key] != security_context[key]:
            overridden.append(f"{WHERE}.sidecars[{name}].securityContext.{key}")
    capabilities: dict[str, Any] = dict(security_context.get("capabilities", {}))
    added = user.get("capabilities", {}).get("add")
    if added:  # spec.pod_template.check_restricted allowed them (NET_BIND_SERVICE)
        capabilities["add"] = list(added)
    container["securityContext"] = {**user, **security_context, "capabilities": capabilities}
    mounts = container.get("volumeMounts")
    if mounts:
        kept = [m for m in mounts if m["name"] not in dropped]
        overridden += [f"{WHERE}.sidecars[{name}].volumeMounts[{m['mountPath']}]" for m in mounts if m not in kept]
        container["volumeMounts"] = kept
    return container


def _spread_constraints(template: PodTemplate, selector: Mapping[str, str]) -> list[dict[str, Any]]:
    """The user's constraints (counting the version's pods unless they say otherwise), then spreadAcross's for every
    topology key they do not already spread over."""
    constraints = [c.to_manifest() for c in template.topology_spread_constraints]
    for constraint in constraints:
        constraint.setdefault("labelSelector", {"matchLabels": dict(selector)})
    keys = {c["topologyKey"] for c in constraints}
    for domain in template.spread_across:
        key = SPREAD_TOPOLOGY_KEYS[domain]
        if key not in keys:
            constraints.append(
                {
                    "maxSkew": 1,
                    "topologyKey": key,
                    "whenUnsatisfiable": "ScheduleAnyway",
                    "labelSelector": {"matchLabels": dict(selector)},
                    # Only the pods of the newest ReplicaSet count: a rollout's old pods do not skew the new ones.
                    "matchLabelKeys": ["pod-template-hash"],
                }
            )
    return constraints


def overridden_message(overridden: tuple[str, ...]) -> str:
    """The PodTemplateOverridden Event's message: each displaced field once, and what to do."""
    fields = ", ".join(dict.fromkeys(overridden))
    return (
        f"the operator sets these itself, so they were not applied: {fields}; remove them from spec.podTemplate "
        "(docs/operator.md lists the fields the operator owns)"
    )
