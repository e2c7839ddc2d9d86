"""spec.auth in a reconcile: the token Secret it names must exist, hold a token and not be a service-account
token; until it does, the Deployments stay as they are (their pods could not start). `auth_problem` is pure."""

from __future__ import annotations

from skiff_operator.conditions import Problem, Reason
from skiff_operator.observed import StoredSecret
from skiff_operator.ownership import refused_secret_message
from skiff_operator.spec import InferenceModel


def auth_problem(model: InferenceModel, secret: StoredSecret | None) -> Problem | None:
    """What holds the model back on spec.auth, given its token Secret as read (None: absent); None when there
    is nothing to check or all is well. The token's value is never read into a message."""
    auth = model.spec.auth
    if auth is None:
        return None
    namespace = model.ref.namespace
    where = f"spec.auth.tokenSecretName: Secret {auth.token_secret_name!r}"
    if secret is None:
        return Problem(
            Reason.AUTH_SECRET_MISSING,
            f"{where} not found in namespace {namespace}; create it with the bearer tokens, one per line, in key "
            f"{auth.token_key!r} (kubectl create secret generic {auth.token_secret_name} "
            f"--from-file={auth.token_key}=tokens.txt)",
        )
    refused = refused_secret_message(secret, where)
    if refused is not None:
        return Problem(Reason.SECRET_REFUSED, refused)
    if not secret.data.get(auth.token_key, b"").strip():
        return Problem(
            Reason.AUTH_SECRET_INVALID,
            f"{where}: key {auth.token_key!r} is missing or lists no token; put the bearer tokens in it, one per line",
        )
    return None
