"""Which existing objects a model may write (only those it controls) and which Secrets it may mount; pure.

The checks return messages; callers report them as reasons NameConflict and SecretRefused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SERVICE_ACCOUNT_TOKEN_TYPE = "kubernetes.io/service-account-token"  # noqa: S105 - a Secret type, not a password
CERTIFICATE_NAME_ANNOTATION = "cert-manager.io/certificate-name"


@dataclass(frozen=True)
class Holder:
    """The controller of an existing object, from its controller ownerReference (all None: it has none)."""

    kind: str | None = None
    name: str | None = None
    uid: str | None = None

    def describe(self) -> str:
        if self.uid is None:
            return "it has no controller (not created by Skiff for this model)"
        return f"it is controlled by {self.kind} {self.name}"


@dataclass(frozen=True)
class Occupant:
    """An existing object of a kind the model renders that the model does not control."""

    kind: str
    name: str
    holder: Holder


@dataclass(frozen=True)
class StoredSecret:
    """A Secret as the API server holds it: decoded data, its type and controller. Never logged or formatted."""

    data: Mapping[str, bytes]
    type: str = "Opaque"
    holder: Holder = Holder()
    annotations: Mapping[str, str] = field(default_factory=dict)


def controller_of(manifest: Mapping[str, Any]) -> Holder:
    """The controller ownerReference of an object as the API returns it."""
    for ref in (manifest.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return Holder(str(ref.get("kind", "")), str(ref.get("name", "")), str(ref.get("uid", "")))
    return Holder()


def occupant(kind: str, manifest: Mapping[str, Any], uid: str) -> Occupant | None:
    """The object as an Occupant when the model with `uid` does not control it; None when it does."""
    holder = controller_of(manifest)
    if holder.uid == uid:
        return None
    return Occupant(kind, str((manifest.get("metadata") or {}).get("name", "")), holder)


def name_conflict_message(conflicts: Sequence[Occupant]) -> str:
    """The NameConflict message, naming every object the model would have taken over and what to do."""
    objects = "; ".join(f"{o.kind}/{o.name} exists and {o.holder.describe()}" for o in conflicts)
    return (
        f"{objects}. The operator writes only objects this model controls and changed nothing: rename the model "
        "(or the version), or delete or rename the existing object"
    )


def foreign_holder(holder: Holder | None, uid: str) -> bool:
    """An object exists (`holder` is not None) and the model with `uid` does not control it."""
    return holder is not None and holder.uid != uid


def refused_secret_message(secret: StoredSecret, where: str) -> str | None:
    """Why the pods must never mount this Secret: a service-account token would hand them an API identity."""
    if secret.type != SERVICE_ACCOUNT_TOKEN_TYPE:
        return None
    return (
        f"{where} is a {SERVICE_ACCOUNT_TOKEN_TYPE} Secret: a model never mounts service-account tokens; "
        "name a Secret of another type"
    )
