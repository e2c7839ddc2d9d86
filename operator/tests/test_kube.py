"""kube: API objects -> child states, and client errors -> domain errors (no API server needed)."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from skiff_operator.errors import ApplyRejected, ClusterUnavailable
from skiff_operator.kube import (
    CRD_CACHE_S,
    EVENT_PAGES_MAX,
    DeadlineApiClient,
    Kube,
    fingerprint,
    manifest_digest,
    translate_error,
)
from skiff_operator.observed import RouteState, deployment_state, owned_by, pod_event, pod_state
from skiff_operator.spec import parse_inference_model
from tests.conftest import stored_body


def test_deployment_state_reads_status_and_progressing_reason() -> None:
    state = deployment_state(
        {
            "metadata": {"generation": 3},
            "status": {
                "observedGeneration": 3,
                "replicas": 3,
                "updatedReplicas": 2,
                "readyReplicas": 1,
                "availableReplicas": 1,
                "conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}],
            },
        }
    )
    assert (state.generation, state.observed_generation, state.replicas) == (3, 3, 3)
    assert (state.updated_replicas, state.ready_replicas, state.available_replicas) == (2, 1, 1)
    assert state.progress_deadline_exceeded is True
    assert state.new_replica_set_available is False


def test_new_deployment_without_status_reads_as_zero() -> None:
    state = deployment_state({"metadata": {"generation": 1}})
    assert (state.observed_generation, state.ready_replicas) == (0, 0)


def test_pod_state_reads_unschedulable_and_waiting() -> None:
    pod = {
        "metadata": {"name": "bert-v1-abc", "labels": {"skiff.dev/version": "v1"}},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",
                }
            ],
            "containerStatuses": [
                {"name": "runtime", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}}
            ],
        },
    }
    state = pod_state(pod, {"v1": "v1"})
    assert state is not None
    assert state.version == "v1"
    assert state.unschedulable_message == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    assert (state.waiting_reason, state.waiting_message) == ("ImagePullBackOff", "not found")


def test_pod_state_reads_the_runtimes_termination_message_only_while_it_is_not_running() -> None:
    last = {"terminated": {"exitCode": 1, "message": "GPUUnavailable: no CUDA"}}
    restarting = {"name": "runtime", "state": {"waiting": {"reason": "CrashLoopBackOff"}}, "lastState": last}
    exited = {"name": "runtime", "state": last}
    running = {"name": "runtime", "state": {"running": {}}, "lastState": last}

    def pod(status: dict[str, object]) -> dict[str, object]:
        meta = {"name": "bert-v1-abc", "labels": {"skiff.dev/version": "v1"}}
        return {"metadata": meta, "status": {"phase": "Running", "containerStatuses": [status]}}

    assert pod_state(pod(restarting), {"v1": "v1"}).terminated_message == "GPUUnavailable: no CUDA"  # type: ignore[union-attr]
    assert pod_state(pod(exited), {"v1": "v1"}).terminated_message == "GPUUnavailable: no CUDA"  # type: ignore[union-attr]
    assert pod_state(pod(running), {"v1": "v1"}).terminated_message is None  # type: ignore[union-attr]


def test_pods_of_removed_versions_and_terminating_pods_are_skipped() -> None:
    old = {"metadata": {"name": "p", "labels": {"skiff.dev/version": "v0"}}, "status": {"phase": "Running"}}
    leaving = {
        "metadata": {"name": "q", "labels": {"skiff.dev/version": "v1"}, "deletionTimestamp": "2026-01-01T00:00:00Z"}
    }
    assert pod_state(old, {"v1": "v1"}) is None
    assert pod_state(leaving, {"v1": "v1"}) is None


def test_pod_event_reads_involved_object() -> None:
    event = pod_event({"involvedObject": {"name": "p"}, "reason": "FailedScheduling", "message": "m"})
    assert (event.pod, event.reason, event.message) == ("p", "FailedScheduling", "m")


def test_owned_by_needs_a_controller_reference_with_the_uid() -> None:
    child = {"metadata": {"ownerReferences": [{"uid": "u1", "controller": True}]}}
    assert owned_by(child, "u1")
    assert not owned_by(child, "u2")
    assert not owned_by({"metadata": {"ownerReferences": [{"uid": "u1"}]}}, "u1")


def api_error(status: int, message: str = "", headers: dict[str, str] | None = None) -> ApiException:
    error = ApiException(status=status, reason="Reason")
    error.body = json.dumps({"message": message}).encode()
    error.headers = headers
    return error


def test_invalid_manifest_is_rejected_with_the_server_message() -> None:
    error = translate_error(api_error(422, 'Deployment.apps "x" is invalid: spec.template'), "Deployment", "x")
    assert isinstance(error, ApplyRejected)
    assert "HTTP 422" in str(error)
    assert "is invalid: spec.template" in str(error)


def test_throttling_and_server_errors_are_retryable() -> None:
    throttled = translate_error(api_error(429, headers={"Retry-After": "7"}), "Service", "s")
    assert isinstance(throttled, ClusterUnavailable)
    assert throttled.retry_after_s == 7.0
    for status in (409, 500, 503):
        assert isinstance(translate_error(api_error(status), "Service", "s"), ClusterUnavailable)


def test_connection_errors_are_retryable() -> None:
    assert isinstance(translate_error(aiohttp.ClientConnectionError("refused"), "Service", "s"), ClusterUnavailable)


def test_secret_data_is_decoded_and_bad_base64_reads_as_missing() -> None:
    from skiff_operator.observed import secret_data

    assert secret_data({"tls.crt": "UEVN", "tls.key": "not base64!"}) == {"tls.crt": b"PEM", "tls.key": b""}
    assert secret_data(None) == {}


async def test_a_hung_api_server_times_out_into_a_retryable_error() -> None:
    """An API server that accepts connections and never answers must not stall a reconcile forever."""
    accepted: list[asyncio.StreamWriter] = []

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # read nothing, answer nothing

    server = await asyncio.start_server(hang, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    configuration = client.Configuration(host=f"http://127.0.0.1:{port}")
    started = time.monotonic()
    async with DeadlineApiClient(configuration, request_timeout_s=0.5) as api:
        with pytest.raises(ClusterUnavailable, match="InferenceModel m"):
            await Kube(api).read_inference_model("ns", "m")
    assert time.monotonic() - started < 5
    assert accepted, "the request reached the hung server"
    server.close()


async def test_pod_watch_is_label_selected_resumes_and_relists_after_gone() -> None:
    """Against a small HTTP server speaking the watch protocol: every request carries the label selector; a
    watch that ends resumes at the last resourceVersion; 410 Gone starts over without one."""
    queries: list[dict[str, str]] = []

    def pod(name: str, version: str) -> dict[str, object]:
        return {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": name, "resourceVersion": version}}

    async def pods(request: web.Request) -> web.StreamResponse:
        queries.append(dict(request.query))
        response = web.StreamResponse()
        await response.prepare(request)
        if len(queries) == 1:
            event = {"type": "ADDED", "object": pod("a", "5")}
        elif len(queries) == 2:
            event = {
                "type": "ERROR",
                "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"},
            }
        else:
            event = {"type": "MODIFIED", "object": pod("b", "9")}
        await response.write(json.dumps(event).encode() + b"\n")
        return response

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/ml/pods", pods)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    seen = []
    async with DeadlineApiClient(client.Configuration(host=f"http://127.0.0.1:{port}")) as api:
        async for raw in Kube(api).watch_children("Pod", "ml", "app=x", timeout_s=5):
            seen.append(raw["metadata"]["name"])
            if len(seen) == 2:
                break
    await runner.cleanup()
    assert seen == ["a", "b"]
    assert [q["labelSelector"] for q in queries] == ["app=x"] * 3
    assert [q.get("resourceVersion") for q in queries] == [None, "5", None]  # resumed, then relisted after 410
    assert all(q["watch"].lower() == "true" for q in queries)


async def test_whether_a_crd_is_served_is_read_once_per_cache_period(monkeypatch: pytest.MonkeyPatch) -> None:
    """Against a small HTTP server: the second reconcile within CRD_CACHE_S sends no request; a later one does."""
    reads: list[str] = []
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "grpcroutes.gateway.networking.k8s.io"},
        "spec": {
            "group": "gateway.networking.k8s.io",
            "names": {"kind": "GRPCRoute", "plural": "grpcroutes"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": True, "storage": True}],
        },
        "status": {"conditions": [{"type": "Established", "status": "True"}]},
    }

    async def read(request: web.Request) -> web.Response:
        reads.append(request.match_info["name"])
        return web.json_response(crd)

    app = web.Application()
    app.router.add_get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}", read)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    clock = [1000.0]
    monkeypatch.setattr("skiff_operator.kube.children.monotonic", lambda: clock[0])
    name = "grpcroutes.gateway.networking.k8s.io"
    async with DeadlineApiClient(client.Configuration(host=f"http://127.0.0.1:{port}")) as api:
        kube = Kube(api)
        assert await kube.crd_serves(name, "v1")
        clock[0] += CRD_CACHE_S - 1
        assert await kube.crd_serves(name, "v1")
        clock[0] += 2
        assert await kube.crd_serves(name, "v1")
    await runner.cleanup()
    assert reads == [name, name]


async def test_backend_tls_children_and_disruption_budgets_are_listed_read_and_deleted_by_their_own_paths() -> None:
    """Against a small HTTP server: with backend TLS, the model's ConfigMaps and BackendTLSPolicies are listed
    (label-selected) with the GRPCRoute, whose status.parents come back as its RouteState, and its
    PodDisruptionBudgets always; a lookup and a delete go to each kind's own path."""
    uid = "uid-1"
    owner = [{"apiVersion": "skiff.dev/v1alpha1", "kind": "InferenceModel", "name": "demo", "uid": uid,
              "controller": True}]  # fmt: skip
    labels = {"skiff.dev/model": "demo"}

    def item(name: str, **extra: object) -> dict[str, object]:
        return {"metadata": {"name": name, "namespace": "ml", "labels": labels, "ownerReferences": owner}, **extra}

    route = item("demo", status={"parents": [{"parentRef": {"name": "public"}, "controllerName": "x",
                                              "conditions": [{"type": "Accepted", "status": "False",
                                                              "reason": "NoMatchingParent"}]}]})  # fmt: skip
    lists = {
        "/apis/apps/v1/namespaces/ml/deployments": [],
        "/api/v1/namespaces/ml/services": [],
        "/apis/networking.k8s.io/v1/namespaces/ml/networkpolicies": [],
        "/api/v1/namespaces/ml/configmaps": [item("demo-backend-ca", data={"ca.crt": "x"})],
        "/apis/gateway.networking.k8s.io/v1/namespaces/ml/grpcroutes": [route],
        "/apis/gateway.networking.k8s.io/v1/namespaces/ml/httproutes": [
            item(
                "demo",
                metadata={
                    "name": "demo",
                    "namespace": "ml",
                    "labels": labels,
                    "ownerReferences": owner,
                    "generation": 3,
                },
            )
        ],
        "/apis/gateway.networking.k8s.io/v1/namespaces/ml/backendtlspolicies": [item("demo-v1")],
        "/apis/policy/v1/namespaces/ml/poddisruptionbudgets": [item("demo-v1", status={"disruptionsAllowed": 1})],
    }
    requests: list[tuple[str, str, str]] = []

    async def serve(request: web.Request) -> web.Response:
        requests.append((request.method, request.path, request.query.get("labelSelector", "")))
        if request.method == "GET" and request.path in lists:
            return web.json_response({"kind": "List", "apiVersion": "v1", "metadata": {}, "items": lists[request.path]})
        if request.method == "GET":
            return web.json_response({"kind": "Status", "code": 404, "message": "not found"}, status=404)
        return web.json_response({"kind": "Status", "status": "Success"})

    app = web.Application()
    app.router.add_route("*", "/{path:.*}", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    body = {"apiVersion": "skiff.dev/v1alpha1", "kind": "InferenceModel",
            "metadata": {"name": "demo", "namespace": "ml", "uid": uid, "generation": 1},
            "spec": {"versions": [{"name": "v1", "modelUri": "pvc://models/a"}]}}  # fmt: skip
    model = parse_inference_model(stored_body(body))
    async with DeadlineApiClient(client.Configuration(host=f"http://127.0.0.1:{port}")) as api:
        kube = Kube(api)
        owned = {
            (c.kind, c.name): c for c in await kube.list_owned(model, routes=True, backend_tls=True, http_routes=True)
        }
        assert set(owned) == {("ConfigMap", "demo-backend-ca"), ("GRPCRoute", "demo"), ("HTTPRoute", "demo"),
                              ("BackendTLSPolicy", "demo-v1"), ("PodDisruptionBudget", "demo-v1")}  # fmt: skip
        assert owned[("HTTPRoute", "demo")].route == RouteState(3)  # REST's route: its generation, no verdict yet
        state = owned[("GRPCRoute", "demo")].route
        assert state is not None
        (parent,) = state.parents
        assert parent.gateway == "ml/public"
        assert parent.accepted is not None
        assert parent.accepted.reason == "NoMatchingParent"
        wanted = [("BackendTLSPolicy", "other"), ("ConfigMap", "other"), ("PodDisruptionBudget", "other")]
        assert await kube.find_occupants("ml", uid, wanted) == ()
        for child in owned.values():
            await kube.delete_child("ml", child)
    await runner.cleanup()
    assert all(selector == "skiff.dev/model=demo" for method, path, selector in requests if path in lists)
    assert ("GET", "/apis/gateway.networking.k8s.io/v1/namespaces/ml/backendtlspolicies/other", "") in requests
    assert ("GET", "/api/v1/namespaces/ml/configmaps/other", "") in requests
    assert ("GET", "/apis/policy/v1/namespaces/ml/poddisruptionbudgets/other", "") in requests
    deleted = {path for method, path, _ in requests if method == "DELETE"}
    assert deleted == {
        "/api/v1/namespaces/ml/configmaps/demo-backend-ca",
        "/apis/gateway.networking.k8s.io/v1/namespaces/ml/grpcroutes/demo",
        "/apis/gateway.networking.k8s.io/v1/namespaces/ml/httproutes/demo",
        "/apis/gateway.networking.k8s.io/v1/namespaces/ml/backendtlspolicies/demo-v1",
        "/apis/policy/v1/namespaces/ml/poddisruptionbudgets/demo-v1",
    }


def _deployment(generation: int, labels: dict[str, str], rv: str = "7") -> dict[str, object]:
    metadata = {"name": "d", "uid": "u1", "generation": generation, "labels": labels, "resourceVersion": rv}
    return {"kind": "Deployment", "metadata": metadata, "status": {"readyReplicas": 1}}


def test_a_deployment_counts_as_unchanged_through_status_updates_but_not_through_spec_or_label_edits() -> None:
    manifest = {"kind": "Deployment", "metadata": {"name": "d", "labels": {"skiff.dev/model": "m"}}}
    applied = fingerprint(_deployment(3, {"skiff.dev/model": "m"}), manifest)
    # A status update moves resourceVersion, not generation: still what the apply left.
    assert fingerprint(_deployment(3, {"skiff.dev/model": "m", "other": "x"}, rv="99"), manifest) == applied
    assert fingerprint(_deployment(4, {"skiff.dev/model": "m"}), manifest) != applied  # kubectl scale / edit
    assert fingerprint(_deployment(3, {"skiff.dev/model": "changed"}), manifest) != applied  # a label edit


def test_a_disruption_budget_counts_as_unchanged_through_status_updates_but_not_through_spec_edits() -> None:
    manifest = {"kind": "PodDisruptionBudget", "metadata": {"name": "b", "labels": {"skiff.dev/model": "m"}}}

    def stored(generation: int, rv: str) -> dict[str, object]:
        metadata = {"name": "b", "uid": "u1", "generation": generation, "labels": {"skiff.dev/model": "m"},
                    "resourceVersion": rv}  # fmt: skip
        return {"kind": "PodDisruptionBudget", "metadata": metadata, "status": {"currentHealthy": 2}}

    applied = fingerprint(stored(1, "7"), manifest)
    assert fingerprint(stored(1, "8"), manifest) == applied  # a pod turned ready: the status moved
    assert fingerprint(stored(2, "9"), manifest) != applied  # someone edited maxUnavailable


def test_other_kinds_count_as_unchanged_only_at_the_same_resource_version() -> None:
    manifest = {"kind": "Service", "metadata": {"name": "s"}}
    stored = {"kind": "Service", "metadata": {"name": "s", "resourceVersion": "10"}}
    assert fingerprint(stored, manifest) == fingerprint({**stored}, manifest)
    assert fingerprint({"kind": "Service", "metadata": {"name": "s", "resourceVersion": "11"}}, manifest) != (
        fingerprint(stored, manifest)
    )


def test_manifest_digest_ignores_key_order_and_sees_every_value() -> None:
    a = {"kind": "Service", "metadata": {"name": "s", "labels": {"a": "1", "b": "2"}}}
    b = {"metadata": {"labels": {"b": "2", "a": "1"}, "name": "s"}, "kind": "Service"}
    assert manifest_digest(a) == manifest_digest(b)
    assert manifest_digest(a) != manifest_digest({**a, "spec": {"type": "ClusterIP"}})


async def test_the_apply_caches_drop_deleted_children_and_deleted_models() -> None:
    """Against a small HTTP server: what Kube remembers of its applies and lists stays with children that still
    exist (a child gone from its model's list is dropped there) and with models that still exist (forget_model);
    an unchanged child is still not applied twice."""
    stored: dict[str, dict[str, object]] = {}
    patches: list[str] = []

    async def serve(request: web.Request) -> web.Response:
        if request.method == "PATCH":
            name = request.path.rsplit("/", 1)[1]
            patches.append(name)
            body = await request.json()
            body["metadata"] |= {"uid": f"uid-{name}", "generation": 1, "resourceVersion": "1"}
            stored[name] = body
            return web.json_response(body)
        model = request.query.get("labelSelector", "").split("=")[-1]
        items = [o for o in stored.values() if o["metadata"]["labels"]["skiff.dev/model"] == model]  # type: ignore[index]
        is_deployments = request.path.endswith("/deployments")
        return web.json_response({"kind": "List", "metadata": {}, "items": items if is_deployments else []})

    app = web.Application()
    app.router.add_route("*", "/{path:.*}", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]

    def model_named(name: str) -> tuple[object, list[dict[str, object]]]:
        body = {"apiVersion": "skiff.dev/v1alpha1", "kind": "InferenceModel",
                "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "generation": 1},
                "spec": {"versions": [{"name": "v1", "modelUri": "pvc://models/a"},
                                      {"name": "v2", "modelUri": "pvc://models/a"}],
                         "traffic": [{"version": "v1", "percent": 50}, {"version": "v2", "percent": 50}]}}  # fmt: skip
        owner = [{"apiVersion": "skiff.dev/v1alpha1", "kind": "InferenceModel", "name": name, "uid": f"uid-{name}",
                  "controller": True}]  # fmt: skip
        manifests = [
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {
                    "name": f"{name}-{v}",
                    "namespace": "ml",
                    "ownerReferences": owner,
                    "labels": {"skiff.dev/model": name, "skiff.dev/version": v},
                },
            }
            for v in ("v1", "v2")
        ]
        return parse_inference_model(stored_body(body)), manifests

    demo, demo_manifests = model_named("demo")
    other, other_manifests = model_named("other")
    async with DeadlineApiClient(client.Configuration(host=f"http://127.0.0.1:{port}")) as api:
        kube = Kube(api)
        for manifest in demo_manifests + other_manifests:
            await kube.apply(manifest)
        assert {key: len(children) for key, children in kube._applied.items()} == {
            ("ml", "demo"): 2,
            ("ml", "other"): 2,
        }

        del stored["demo-v2"]  # a removed version's Deployment, deleted
        await kube.list_owned(demo, routes=False)  # type: ignore[arg-type]
        assert set(kube._applied[("ml", "demo")]) == {("Deployment", "demo-v1")}
        await kube.apply(demo_manifests[0])  # unchanged since its apply, as listed: not applied again
        assert patches.count("demo-v1") == 1

        await kube.list_owned(other, routes=False)  # type: ignore[arg-type]
        kube.forget_model("ml", "demo")  # the model was deleted
        assert set(kube._applied) == {("ml", "other")}
        assert set(kube._listed) == {("ml", "other")}
    await runner.cleanup()


async def test_failed_scheduling_events_are_read_in_pages_until_every_pending_pod_has_one() -> None:
    """Against a small HTTP server with 3,000 FailedScheduling Events of other pods in the namespace: the list is
    paginated (limit, continue), stops at the page that holds the pending pods' Events, and is bounded when they
    have none."""
    others = [{"involvedObject": {"name": f"someone-{n:04}"}, "reason": "FailedScheduling", "message": "x"}
              for n in range(3000)]  # fmt: skip
    ours = {"involvedObject": {"name": "demo-v1-abc"}, "reason": "FailedScheduling", "message": "0/1 nodes: GPU"}
    events = [*others[:600], ours, *others[600:]]
    pages: list[tuple[str, str]] = []

    async def serve(request: web.Request) -> web.Response:
        if request.path.endswith("/events"):
            limit, start = int(request.query["limit"]), int(request.query.get("continue") or 0)
            pages.append((request.query["limit"], request.query.get("continue", "")))
            more = str(start + limit) if start + limit < len(events) else ""
            return web.json_response({"metadata": {"continue": more}, "items": events[start : start + limit]})
        pod = {
            "metadata": {"name": "demo-v1-abc", "labels": {"skiff.dev/version": "v1"}},
            "status": {"phase": "Pending"},
        }
        return web.json_response({"metadata": {}, "items": [pod] if request.path.endswith("/pods") else []})

    app = web.Application()
    app.router.add_route("*", "/{path:.*}", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    body = {"apiVersion": "skiff.dev/v1alpha1", "kind": "InferenceModel",
            "metadata": {"name": "demo", "namespace": "ml", "uid": "uid-1", "generation": 1},
            "spec": {"versions": [{"name": "v1", "modelUri": "pvc://models/a"}]}}  # fmt: skip
    model = parse_inference_model(stored_body(body))
    async with DeadlineApiClient(client.Configuration(host=f"http://127.0.0.1:{port}")) as api:
        kube = Kube(api)
        children = await kube.read_children(model)
        assert [(e.pod, e.message) for e in children.events] == [("demo-v1-abc", "0/1 nodes: GPU")]
        assert pages == [("250", ""), ("250", "250"), ("250", "500")]  # the third page holds it: no fourth
        del events[600]
        pages.clear()
        assert (await kube.read_children(model)).events == ()
        assert len(pages) == EVENT_PAGES_MAX  # 3,000 others would be 12 pages of 250: 8 are read
    await runner.cleanup()
