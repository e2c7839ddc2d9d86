"""model_fetch: the digest and the failures a fetched version's pods report, read from pod statuses as the kubelet
writes them, into status.versions[] and ModelFetchFailed; the digest pinned into later pods until the URI changes."""

from __future__ import annotations

import datetime
import json
from typing import Any

import jsonschema

from skiff_operator.conditions import Reason
from skiff_operator.manifests import render_all
from skiff_operator.model_fetch import loaded_digest
from skiff_operator.model_status import parse_status
from skiff_operator.observed import ChildStates, DeploymentState, PodState, pod_state
from skiff_operator.plan import Observed, Plan, make_plan
from skiff_operator.spec import InferenceModel, parse_inference_model
from skiff_operator.summary import summarize_status
from skiff_operator.tls import TLSObserved
from tests.conftest import FIRST_PASS, crd_schema, stored_body, wire

NOW = datetime.datetime(2026, 5, 1, 12, 0, tzinfo=datetime.UTC)
URI = "s3://models/bert/v1"
DIGEST = "sha256:" + "ab" * 32


def fetched_model(uri: str = URI) -> InferenceModel:
    body = stored_body(
        {
            "metadata": {"name": "bert", "namespace": "nlp"},
            "spec": {
                "versions": [{"name": "v1", "modelUri": uri, "replicas": 1}],
                "storage": {"s3": {"endpoint": "http://seaweedfs.storage:8333", "secretName": "s3-reader"}},
            },
        }
    )
    return parse_inference_model(body)


def recorded_pod(init: dict[str, Any], *, running: bool) -> dict[str, Any]:
    """A pod of version v1 as the kubelet reports it: the fetch-model init container's status, then the runtime."""
    runtime = (
        {"running": {"startedAt": "2026-05-01T11:59:00Z"}} if running else {"waiting": {"reason": "PodInitializing"}}
    )
    return {
        "metadata": {"name": "bert-v1-7d9f-abcde", "labels": {"skiff.dev/version": "v1"}},
        "status": {
            "phase": "Running" if running else "Pending",
            "initContainerStatuses": [{"name": "fetch-model", **init}],
            "containerStatuses": [{"name": "runtime", "state": runtime}],
        },
    }


def fetched_pod() -> PodState:
    report = {"uri": URI, "digest": DIGEST, "files": 2, "bytes": 1234, "reused": False}
    init = {"state": {"terminated": {"exitCode": 0, "reason": "Completed", "message": json.dumps(report)}}}
    state = pod_state(recorded_pod(init, running=True), {"v1": "v1"})
    assert state is not None
    return state


def failed_pod(reason: str, message: str) -> PodState:
    """A fetch that failed and waits to be retried: CrashLoopBackOff, the failure in lastState."""
    init = {
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s restarting failed container"}},
        "lastState": {"terminated": {"exitCode": 1, "message": json.dumps({"reason": reason, "message": message})}},
    }
    state = pod_state(recorded_pod(init, running=False), {"v1": "v1"})
    assert state is not None
    return state


def status_of(model: InferenceModel, pods: tuple[PodState, ...], ready: int) -> dict[str, Any]:
    deployment = DeploymentState(1, 1, 1, 1, ready, ready, new_replica_set_available=ready > 0)
    return wire(summarize_status(model, ChildStates(deployments={"v1": deployment}, pods=pods), now=NOW))


def test_the_digest_a_pod_fetched_is_in_status_versions() -> None:
    status = status_of(fetched_model(), (fetched_pod(),), ready=1)
    (version,) = status["versions"]
    assert version["modelUri"] == URI
    assert version["modelDigest"] == DIGEST
    jsonschema.validate(status, crd_schema()["properties"]["status"])


def test_a_pvc_version_reports_no_digest(make_body: Any) -> None:
    model = parse_inference_model(make_body())
    (version,) = status_of(model, (), ready=1)["versions"]
    assert "modelDigest" not in version
    assert "modelUri" not in version


def test_a_failed_fetch_is_model_fetch_failed_with_its_reason() -> None:
    pod = failed_pod("AccessDenied", "s3://models/bert/v1: the server refused the credentials (403)")
    status = status_of(fetched_model(), (pod,), ready=0)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False"
    assert ready["reason"] == Reason.MODEL_FETCH_FAILED
    assert "(AccessDenied)" in ready["message"]
    assert "refused the credentials" in ready["message"]
    assert "modelDigest" not in status["versions"][0]  # nothing was loaded


def test_each_fetch_reason_reaches_the_condition() -> None:
    for reason in ("NotFound", "ChecksumMismatch", "TooLarge", "Timeout"):
        status = status_of(fetched_model(), (failed_pod(reason, "why"),), ready=0)
        degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
        assert degraded["reason"] == "ModelFetchFailed"
        assert f"({reason}): why" in degraded["message"]


def test_a_message_that_is_not_json_still_fails_clearly() -> None:
    init = {"state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}
    pod = pod_state(recorded_pod(init, running=False), {"v1": "v1"})
    assert pod is not None
    status = status_of(fetched_model(), (pod,), ready=0)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "ModelFetchFailed"
    assert "(Unknown): the fetch exited with code 137" in ready["message"]


def plan_after(status: dict[str, Any], model: InferenceModel) -> Plan:
    plan = make_plan(model, Observed(TLSObserved(), status=parse_status(status)), FIRST_PASS)
    assert isinstance(plan, Plan)
    return plan


def rendered(plan: Plan, kind: str) -> dict[str, Any]:
    return next(m for m in render_all(plan) if m["kind"] == kind)


def pins(plan: Plan) -> dict[str, Any]:
    data: dict[str, Any] = {k: json.loads(v) for k, v in rendered(plan, "ConfigMap")["data"].items()}
    return data


def test_once_status_holds_a_digest_new_pods_expect_it_until_the_uri_changes() -> None:
    status = status_of(fetched_model(), (fetched_pod(),), ready=1)
    first = plan_after(status_of(fetched_model(), (), ready=0), fetched_model())
    pinned = plan_after(status, fetched_model())
    assert pins(pinned) == {"v1": {"uri": "s3://models/bert/v1", "digest": DIGEST}}
    # The pin lives in the ConfigMap: the pod template is the one the first pods ran (no roll to learn it).
    assert rendered(pinned, "Deployment")["spec"]["template"] == rendered(first, "Deployment")["spec"]["template"]
    # The pods of the pinned plan are gone (scaled, evicted): status keeps the digest it holds.
    assert wire(summarize_status(pinned.running, ChildStates(), now=NOW))["versions"][0]["modelDigest"] == DIGEST
    moved = plan_after(status, fetched_model("s3://models/bert/v2"))
    assert pins(moved) == {}


def test_a_version_with_no_digest_yet_is_not_pinned() -> None:
    assert pins(plan_after(status_of(fetched_model(), (), ready=0), fetched_model())) == {}


def test_an_oci_uri_pinned_by_digest_reports_it_before_any_pod_and_a_tag_reports_what_was_pulled() -> None:
    by_digest = fetched_model(f"oci://registry.example:5000/models/bert@{DIGEST}")
    assert loaded_digest(by_digest.spec.versions[0], ()) == DIGEST  # the kubelet or the fetch refuses any other
    by_tag = fetched_model("oci://registry.example:5000/models/bert:v1")
    assert loaded_digest(by_tag.spec.versions[0], ()) is None  # unknown until a pod pulled it
