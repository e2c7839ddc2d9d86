"""Which existing objects a model may write (only those it controls) and which Secrets it may mount; pure.

The checks return messages; callers report them as reasons NameConflict and SecretRefused.
"""

from __future__ import annotations

from collections.abc import Sequence

from skiff_operator.observed import Holder, Occupant, StoredSecret

SERVICE_ACCOUNT_TOKEN_TYPE = "kubernetes.io/service-account-token"  # noqa: S105 - a Secret type, not a password
CERTIFICATE_NAME_ANNOTATION = "cert-manager.io/certificate-name"


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
