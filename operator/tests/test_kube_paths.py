"""kube: every request path the operator builds stays in the model's namespace. A name that is not a DNS-1123
name (`../../team-b/secrets/x`, normalised by the API server into another namespace's Secret) is refused
before any request is sent; a whole reconcile against a recording HTTP server asks only for paths in `ml`."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from skiff_operator.errors import ApplyRejected
from skiff_operator.kube import DeadlineApiClient, Kube, collection_path, object_path
from skiff_operator.reconcile import reconcile
from tests.conftest import FIRST_PASS, stored_body

HOSTILE = ["../../team-b/secrets/x", "x/../../y", "..", "a/b", "x%2F..%2Fy", "x?watch=1", "x#y", "X", "a" * 254, ""]
# The model's namespace, or the one cluster-scoped read the operator makes (is the GRPCRoute CRD served?).
IN_NAMESPACE = re.compile(
    r"^(/api/v1|/apis/[a-z0-9.-]+/v[0-9a-z]+)/namespaces/ml/[a-z]+(/[a-z0-9]([-a-z0-9.]*[a-z0-9])?(/status)?)?$"
    r"|^/apis/apiextensions\.k8s\.io/v1/customresourcedefinitions/[a-z0-9.-]+$"
)


@pytest.mark.parametrize("name", HOSTILE)
def test_a_name_that_is_not_a_dns_name_builds_no_path(name: str) -> None:
    with pytest.raises(ApplyRejected, match="not a DNS-1123 name"):
        object_path("v1", "Secret", "ml", name)
    assert object_path("v1", "Secret", "ml", "team-a.tls") == "/api/v1/namespaces/ml/secrets/team-a.tls"


@pytest.mark.parametrize("namespace", ["..", "team-b/secrets", "a.b", "", "A"])
def test_a_namespace_that_is_not_a_dns_label_builds_no_path(namespace: str) -> None:
    with pytest.raises(ApplyRejected, match="not a DNS-1123 label"):
        collection_path("v1", "Pod", namespace)
    assert collection_path("v1", "Pod", "team-a") == "/api/v1/namespaces/team-a/pods"


class Recorder:
    """A tiny API server: lists are empty, objects are not found, writes succeed; every request is kept."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []

    async def serve(self, request: web.Request) -> web.Response:
        self.requests.append((request.method, request.raw_path))
        if request.method == "GET" and ("labelSelector" in request.query or "fieldSelector" in request.query):
            return web.json_response({"kind": "List", "apiVersion": "v1", "metadata": {}, "items": []})
        if request.method == "GET":
            return web.json_response({"kind": "Status", "code": 404, "message": "not found"}, status=404)
        return web.json_response({})


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[Recorder, Kube]]:
    recording = Recorder()
    app = web.Application()
    app.router.add_route("*", "/{path:.*}", recording.serve)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    async with DeadlineApiClient(client.Configuration(host=f"http://127.0.0.1:{port}")) as api:
        yield recording, Kube(api)
    await runner.cleanup()


@pytest.mark.parametrize("name", HOSTILE[:6])
async def test_reads_by_a_hostile_name_send_nothing(recorder: tuple[Recorder, Kube], name: str) -> None:
    recording, kube = recorder
    for read in (
        kube.read_secret("ml", name),
        kube.read_controller("cert-manager.io/v1", "Certificate", "ml", name),
        kube.missing_claims("ml", [name]),
        kube.read_inference_model("ml", name),
        kube.patch_status("ml", name, {}),
    ):
        with pytest.raises(ApplyRejected):
            await read
    assert recording.requests == []
    assert await kube.read_secret("ml", "team-a-tls") is None  # the allowed variant is asked for
    assert recording.requests == [("GET", "/api/v1/namespaces/ml/secrets/team-a-tls")]


def model(tls: dict[str, Any], auth: dict[str, Any]) -> dict[str, Any]:
    return stored_body(
        {
            "apiVersion": "skiff.dev/v1alpha1",
            "kind": "InferenceModel",
            "metadata": {"name": "demo", "namespace": "ml"},
            "spec": {
                "versions": [{"name": "v1", "modelUri": "pvc://models/a"}],
                "tls": tls,
                "auth": auth,
                "runtime": {"imagePullSecrets": ["regcred"]},
            },
        }
    )


async def test_a_reconcile_asks_only_for_paths_in_the_model_namespace(recorder: tuple[Recorder, Kube]) -> None:
    recording, kube = recorder
    body = model({"mode": "Secret", "secretName": "team-a-tls", "clientCASecretName": "team-a-ca"},
                 {"tokenSecretName": "team-a-token"})  # fmt: skip
    outcome = await reconcile(body, kube, FIRST_PASS)
    paths = [path for _, path in recording.requests]
    assert "/api/v1/namespaces/ml/secrets/team-a-tls" in paths  # the Secrets the spec names were read ...
    assert [p for p in paths if not IN_NAMESPACE.match(p.split("?")[0])] == []  # ... and nothing outside `ml`
    assert outcome.status.conditions  # a status to write


@pytest.mark.parametrize(
    ("tls", "auth"),
    [
        ({"mode": "Secret", "secretName": "../../team-b/secrets/x"}, {"tokenSecretName": "t"}),
        ({"mode": "SelfSigned", "clientCASecretName": "../../team-b/secrets/x"}, {"tokenSecretName": "t"}),
        ({"mode": "SelfSigned"}, {"tokenSecretName": "../../team-b/secrets/x"}),
    ],
)
async def test_a_secret_name_that_is_a_path_is_invalid_spec_and_reads_nothing(
    recorder: tuple[Recorder, Kube], tls: dict[str, Any], auth: dict[str, Any]
) -> None:
    """Past a CRD without the pattern (an old CRD, or none at all): the parser refuses, no Secret is read."""
    recording, kube = recorder
    outcome = await reconcile(model(tls, auth), kube, FIRST_PASS)
    ready = next(c for c in outcome.status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", "InvalidSpec")
    assert "must be the name of an object" in ready.message
    assert recording.requests == []
