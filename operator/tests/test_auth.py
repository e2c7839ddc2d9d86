"""auth (spec.auth): the token Secret's one key mounted as the runtime's token file; a missing, empty or
service-account Secret holds the Deployments with a readable condition that never quotes the token."""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from typing import Any

from skiff_operator.reconcile import reconcile
from tests.conftest import wire
from tests.fakes import TLSFakeCluster, condition

NOW = datetime.datetime(2026, 5, 1, 12, 0, tzinfo=datetime.UTC)
Body = Callable[..., dict[str, Any]]
AUTH = {"tokenSecretName": "demo-token"}


def ready_message(status: dict[str, Any]) -> str:
    return str(next(c["message"] for c in status["conditions"] if c["type"] == "Ready"))


async def test_the_token_key_alone_is_mounted_and_named_to_the_runtime(make_body: Body) -> None:
    cluster = TLSFakeCluster()
    cluster.put_secret("demo-token", {"token": b"s3cret\n", "other": b"not mounted"})
    await reconcile(make_body(auth=AUTH), cluster, NOW)
    pod = cluster.objects[("Deployment", "demo-v1")]["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "auth")
    assert volume["secret"]["secretName"] == "demo-token"
    assert volume["secret"]["items"] == [{"key": "token", "path": "token"}]
    container = pod["containers"][0]
    assert {"name": "SKIFF_AUTH_TOKEN_FILE", "value": "/etc/skiff/auth/token"} in container["env"]
    assert {"name": "auth", "mountPath": "/etc/skiff/auth", "readOnly": True} in container["volumeMounts"]
    assert "s3cret" not in json.dumps(cluster.objects[("Deployment", "demo-v1")])


async def test_a_custom_key_is_mounted_under_the_file_name_the_runtime_reads(make_body: Body) -> None:
    cluster = TLSFakeCluster()
    cluster.put_secret("demo-token", {"bearer": b"t"})
    await reconcile(make_body(auth={**AUTH, "tokenKey": "bearer"}), cluster, NOW)
    volumes = cluster.objects[("Deployment", "demo-v1")]["spec"]["template"]["spec"]["volumes"]
    assert next(v for v in volumes if v["name"] == "auth")["secret"]["items"] == [{"key": "bearer", "path": "token"}]


async def test_missing_empty_or_token_secrets_hold_the_deployment(make_body: Body) -> None:
    cluster = TLSFakeCluster()
    missing = await reconcile(make_body(auth=AUTH), cluster, NOW)
    assert condition(wire(missing.status), "Ready") == ("False", "AuthSecretMissing")
    assert "kubectl create secret generic demo-token" in ready_message(wire(missing.status))

    cluster.put_secret("demo-token", {"token": b"  \n"})
    empty = await reconcile(make_body(auth=AUTH), cluster, NOW)
    assert condition(wire(empty.status), "Ready") == ("False", "AuthSecretInvalid")

    cluster.put_secret("demo-token", {"token": b"jwt"}, kind="kubernetes.io/service-account-token")
    refused = await reconcile(make_body(auth=AUTH), cluster, NOW)
    assert condition(wire(refused.status), "Ready") == ("False", "SecretRefused")
    assert "jwt" not in json.dumps(wire(refused.status))
    assert ("Deployment", "demo-v1") not in cluster.objects
