"""Renders what spec.auth adds to a pod: the token Secret's one key as a file, and the runtime's variable naming it."""

from __future__ import annotations

from typing import Any

from skiff_operator import contract
from skiff_operator.render.tls import secret_volume
from skiff_operator.spec import InferenceModel

AUTH_VOLUME = "auth"


def render_auth_volumes(model: InferenceModel) -> list[dict[str, Any]]:
    auth = model.spec.auth
    if auth is None:
        return []
    return [secret_volume(AUTH_VOLUME, auth.token_secret_name, {auth.token_key: contract.AUTH_TOKEN_FILE_NAME})]


def render_auth_mounts(model: InferenceModel) -> list[dict[str, Any]]:
    if model.spec.auth is None:
        return []
    return [{"name": AUTH_VOLUME, "mountPath": contract.AUTH_DIR, "readOnly": True}]


def render_auth_env(model: InferenceModel) -> list[tuple[str, str]]:
    """The runtime re-reads the file when the kubelet updates it (a changed Secret): rotation needs no restart."""
    if model.spec.auth is None:
        return []
    return [(contract.ENV_AUTH_TOKEN_FILE, f"{contract.AUTH_DIR}/{contract.AUTH_TOKEN_FILE_NAME}")]
