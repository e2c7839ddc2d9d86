"""A model fetched from s3:// on a real API server with kwok's simulated pods: the Deployment the operator writes
carries the fetch-model init container (admitted under Pod Security "restricted"), the credentials from the Secret
in that container only, and an emptyDir for the model; the digest a pod's fetch reports (its termination message,
set here as the kubelet would write it) reaches status.versions[] and is pinned for later pods in the model's digest
ConfigMap, which the pod template reads from the start (so the Deployment does not roll to learn it); a failed fetch
is ModelFetchFailed with its reason. The real fetch against real S3 and HTTPS servers: runtime/tests/fetch/."""

from __future__ import annotations

import json
import time
from typing import Any

from devtools.cluster import Kubectl, eventually
from devtools.models import load_example

from e2e.harness import OperatorProcess, condition

DIGEST = "sha256:" + "5e" * 32


def _version_pods(kube: Kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    pods = kube.get("pods", "-n", namespace, "-l", f"skiff.dev/model={name}")["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def _report_fetch(kube: Kubectl, namespace: str, pod: dict[str, Any], entry: dict[str, Any]) -> None:
    """Writes the fetch-model init container's status into the pod's status, as the kubelet would."""
    image = pod["spec"]["initContainers"][0]["image"]
    status = {"name": "fetch-model", "image": image, "imageID": "", "ready": False, "restartCount": 0, **entry}
    patch = json.dumps({"status": {"initContainerStatuses": [status]}})
    kube.run(
        "patch", "pod", pod["metadata"]["name"], "-n", namespace, "--subresource=status", "--type=merge", "-p", patch
    )


def test_an_s3_model_is_fetched_by_its_init_container_and_its_digest_reaches_status(
    kube: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    kube.run("create", "secret", "generic", "s3-reader", "-n", namespace,
             "--from-literal=AWS_ACCESS_KEY_ID=reader", "--from-literal=AWS_SECRET_ACCESS_KEY=never-shown")  # fmt: skip
    body = load_example("s3", namespace)
    body["spec"]["versions"][0]["replicas"] = 1
    name = body["metadata"]["name"]
    kube.apply(body)
    deployment = eventually(
        lambda: kube.get_or_none("deployment", f"{name}-v1", namespace), timeout=60, what="the Deployment"
    )
    pod_spec = deployment["spec"]["template"]["spec"]
    (init,) = pod_spec["initContainers"]
    assert init["command"] == ["python", "-m", "skiff_runtime.fetch"]
    assert init["args"][:2] == ["--uri", "s3://models/sample-cnn/v1"]
    secrets = {
        e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in init["env"] if "secretKeyRef" in e["valueFrom"]
    }
    assert secrets == {
        "AWS_ACCESS_KEY_ID": "s3-reader", "AWS_SECRET_ACCESS_KEY": "s3-reader", "AWS_SESSION_TOKEN": "s3-reader",
    }  # fmt: skip
    (runtime,) = pod_spec["containers"]
    assert not [e for e in runtime["env"] if "valueFrom" in e or e["name"].startswith("AWS_")]
    assert {"name": "model", "emptyDir": {}} in pod_spec["volumes"]

    # kwok runs the pod (Pod Security "restricted" admitted the init container); its fetch reports a digest.
    (pod,) = eventually(lambda: _version_pods(kube, namespace, name) or None, timeout=60, what="the version's pod")
    report = {"uri": "s3://models/sample-cnn/v1", "digest": DIGEST, "files": 2, "bytes": 4096, "reused": False}
    _report_fetch(kube, namespace, pod, {"state": {"terminated": {
        "exitCode": 0, "reason": "Completed", "message": json.dumps(report),
        "startedAt": "2026-05-01T12:00:00Z", "finishedAt": "2026-05-01T12:00:01Z"}}})  # fmt: skip

    def digest_in_status() -> dict[str, Any] | None:
        versions = (kube.get("inferencemodel", name, "-n", namespace).get("status") or {}).get("versions") or []
        return versions[0] if versions and versions[0].get("modelDigest") == DIGEST else None

    version = eventually(digest_in_status, timeout=60, what="the fetched digest in status.versions[]")
    assert version["modelUri"] == "s3://models/sample-cnn/v1"

    # Later pods must fetch the same content: the model's digest ConfigMap pins it, and the template stays as it was.
    generation = deployment["metadata"]["generation"]

    def pin() -> dict[str, Any] | None:
        config_map = kube.get_or_none("configmap", f"{name}-model-digests", namespace)
        data = (config_map or {}).get("data") or {}
        return json.loads(data["v1"]) if "v1" in data else None

    assert eventually(pin, timeout=60, what="the pin in the digest ConfigMap") == {
        "uri": "s3://models/sample-cnn/v1", "digest": DIGEST,
    }  # fmt: skip
    assert init["env"][-1]["valueFrom"]["configMapKeyRef"] == {
        "name": f"{name}-model-digests", "key": "v1", "optional": True,
    }  # fmt: skip
    time.sleep(3)  # a reconcile or two after the pin: the Deployment is not rewritten
    current = kube.get("deployment", f"{name}-v1", "-n", namespace)
    assert current["metadata"]["generation"] == generation
    assert current["spec"]["template"] == deployment["spec"]["template"]

    # A pod whose fetch is refused (the object changed under the URI) is ModelFetchFailed, with its reason.
    kube.run("delete", "pod", pod["metadata"]["name"], "-n", namespace, "--wait=false")

    def new_pod() -> dict[str, Any] | None:
        pods = [p for p in _version_pods(kube, namespace, name) if p["metadata"]["name"] != pod["metadata"]["name"]]
        return pods[0] if pods else None

    refused = eventually(new_pod, timeout=60, what="a new pod of the same template")
    failure = {"reason": "ChecksumMismatch", "message": "the model at this URI changed"}
    _report_fetch(kube, namespace, refused, {
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}},
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": json.dumps(failure),
                                     "startedAt": "2026-05-01T12:01:00Z", "finishedAt": "2026-05-01T12:01:01Z"}},
    })  # fmt: skip

    def fetch_failed() -> dict[str, Any] | None:
        model = kube.get("inferencemodel", name, "-n", namespace)
        degraded = condition(model, "Degraded") if (model.get("status") or {}).get("conditions") else {}
        return degraded if degraded.get("reason") == "ModelFetchFailed" else None

    degraded = eventually(fetch_failed, timeout=60, what="Degraded=True, ModelFetchFailed")
    assert "(ChecksumMismatch): the model at this URI changed" in degraded["message"]
    assert "never-shown" not in json.dumps(kube.get("inferencemodel", name, "-n", namespace))
