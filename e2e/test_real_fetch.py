"""Fetched models on the real node (devtools/node/), fetched by the runtime image's own init step from real servers
bound to the node's address: SeaweedFS's S3 (devtools/storage.py), an HTTPS server with a private CA
(spec.storage.caConfigMapName) and a docker-registry (plain http, spec.storage.oci.insecure) holding the sample
model as the OCI artifact `skiff_runtime.fetch.pack` pushes. The sample model from s3://, https:// and oci:// answers
exactly what the same model answers from pvc://, and status names the digest of its files (for oci:// the manifest
digest the push printed); a wrong checksum, a missing object and a Secret with
a wrong key each give ModelFetchFailed with the reason and no pod serving; no credential reaches a log, an event or
status. The digest a version learned pins it without a roll: a changed object at the same URI fails the version's
next pod loudly while the first keeps serving. And start-up is measured (`kubectl apply` -> first answer) for a
~100 MB model from s3:// cold beside pvc://, for the second pod of the same version, and from oci:// cold
(docs/storage.md).

The tests share one namespace, one operator, the stores and the models (applied together, so their pods start
while the first test waits) and run in file order.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton
from devtools import storage
from devtools.cluster import Kubectl, eventually
from devtools.images import Images
from devtools.models import real_model
from devtools.node.config import NETWORK
from devtools.node.real_node import RealNode
from devtools.traffic import INPUT, write_sample_model

from e2e.harness import OperatorProcess, condition
from e2e.real_models import create_real_namespace, delete_real_namespace, write_large_model
from skiff_operator import contract
from skiff_runtime.fetch.digest import directory_digest
from skiff_runtime.fetch.oci import OciAccess
from skiff_runtime.fetch.pack import push_model
from skiff_runtime.fetch.sigv4 import Credentials, object_path
from skiff_runtime.fetch.source import Limits
from skiff_runtime.fetch.transfer import Transport

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

PVC, S3, HTTPS, OCI = "fetch-pvc", "fetch-s3", "fetch-https", "fetch-oci"
BAD_SUM, MISSING, DENIED = "fetch-bad-sum", "fetch-missing", "fetch-denied"
LARGE_S3, LARGE_PVC, LARGE_OCI = "large-s3", "large-pvc", "large-oci"
WRONG = Credentials(storage.READER.access_key, "wrong-secret-key-never-shown-0123")
LARGE_MB = 100
# The node has 2000m allocatable. A served pod requests max(its runtime's cpu, the fetch init container's 250m), a
# failing one the init container's 250m: 4 served x 250m + 3 failing x 250m = 1750m, room for one more to start.
SERVED_CPU = "250m"


@dataclass(frozen=True)
class Stores:
    namespace: str
    models: Path  # the claim "models" on the node
    sample: Path
    s3: storage.S3Server
    https: str  # base URL
    registry: storage.OciRegistry
    oci_digest: str  # the manifest digest the push of the sample model printed
    image: str
    operator: OperatorProcess

    def oci_uri(self, repository: str) -> str:
        return f"oci://{self.registry.address}/{repository}:v1"


def s3_storage(s3: storage.S3Server, secret: str) -> dict[str, Any]:
    return {"s3": {"endpoint": s3.url, "region": storage.REGION, "secretName": secret}}


def fetched_model(stores: Stores, name: str, uri: str, storage_spec: dict[str, Any], **version: Any) -> dict[str, Any]:
    body = real_model(stores.namespace, name, uri, stores.image)
    body["spec"]["versions"][0].update(version)
    body["spec"]["storage"] = storage_spec
    body["spec"]["resources"]["cpu"] = SERVED_CPU
    return body


OCI_STORAGE = {"oci": {"insecure": True}}  # the registry on the node speaks plain http


def push(registry: storage.OciRegistry, model: Path, repository: str) -> str:
    """`model` packed and pushed as `repository:v1` (what `make model-image` does); the manifest digest."""
    uri = f"oci://{registry.address}/{repository}:v1"
    return push_model(model, uri, OciAccess(insecure=True), Transport(Limits())).digest


def s3_secret(namespace: str, name: str, credentials: Credentials) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "stringData": {"AWS_ACCESS_KEY_ID": credentials.access_key, "AWS_SECRET_ACCESS_KEY": credentials.secret_key},
    }


def tarball(directory: Path, target: Path) -> str:
    """`directory`'s files as a .tar.gz (paths relative to it); its sha256."""
    with tarfile.open(target, "w:gz") as archive:
        for path in sorted(p for p in directory.rglob("*") if p.is_file()):
            archive.add(path, arcname=path.relative_to(directory).as_posix())
    return hashlib.sha256(target.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def stores(
    real_node: RealNode, kube: Kubectl, crd: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stores]:
    if storage.weed_binary() is None:
        pytest.fail(storage.WEED_HINT, pytrace=False)
    if not real_node.running:  # make demo's test stops the session's node (one node per machine)
        real_node.start()
    namespace = f"e2e-real-fetch-{uuid.uuid4().hex[:6]}"
    models = create_real_namespace(kube, real_node, namespace)
    scratch = tmp_path_factory.mktemp("real-fetch")
    sample = models / "sample-cnn" / "v1"
    write_sample_model(sample)
    address = NETWORK.node_ip  # the node's own address: its pods reach it, nothing off this machine does
    ca, cert, key = storage.serving_certificate(address)
    for name, data in (("ca.crt", ca), ("cert.pem", cert), ("key.pem", key)):
        (scratch / name).write_bytes(data)
    (scratch / "files").mkdir()
    sha256 = tarball(sample, scratch / "files" / "sample-cnn-v1.tar.gz")
    operator = OperatorProcess(kube, namespace, scratch / "operator.log")
    with (
        storage.seaweedfs(scratch / "weed", address) as s3,
        storage.https_files(scratch / "files", address, scratch / "cert.pem", scratch / "key.pem") as https,
        storage.docker_registry(scratch / "registry", address) as registry,
    ):
        s3.upload(sample, storage.BUCKET, "sample-cnn/v1")
        oci_digest = push(registry, sample, "models/sample-cnn")
        kube.apply([s3_secret(namespace, "s3-reader", storage.READER), s3_secret(namespace, "s3-wrong", WRONG)])
        kube.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "storage-ca", "namespace": namespace},
                    "data": {"ca.crt": ca.decode()}})  # fmt: skip
        operator.start()
        stores = Stores(namespace, models, sample, s3, https, registry, oci_digest, Images.from_script().runtime,
                        operator)  # fmt: skip
        reader, wrong, ca_only = (
            s3_storage(s3, "s3-reader"),
            s3_storage(s3, "s3-wrong"),
            {"caConfigMapName": "storage-ca"},
        )
        served = [
            real_model(namespace, PVC, "pvc://models/sample-cnn/v1", stores.image),
            fetched_model(stores, S3, "s3://models/sample-cnn/v1", reader),
            fetched_model(stores, HTTPS, f"{https}/sample-cnn-v1.tar.gz", ca_only, sha256=sha256),
            fetched_model(stores, OCI, stores.oci_uri("models/sample-cnn"), OCI_STORAGE),
        ]
        served[0]["spec"]["resources"]["cpu"] = SERVED_CPU
        failing = [
            fetched_model(stores, BAD_SUM, f"{https}/sample-cnn-v1.tar.gz", ca_only, sha256="0" * 64),
            fetched_model(stores, MISSING, "s3://models/nothing-here/v1", reader),
            fetched_model(stores, DENIED, "s3://models/sample-cnn/v1", wrong),
        ]
        for body in failing:  # they never serve: the init container's 250m is what the node reserves for them
            body["spec"]["resources"] = {"cpu": "100m", "memory": "512Mi"}
        kube.apply([*served, *failing])
        try:
            yield stores
        finally:
            operator.stop()
            print(f"---- operator log ----\n{operator.log()[-20000:]}")
            for model in (S3, HTTPS, OCI, BAD_SUM, MISSING, DENIED, LARGE_S3, LARGE_OCI):
                print(f"---- {model} fetch log ----\n{real_node.container_log(namespace, f'{model}-*', 'fetch-model')}")
            delete_real_namespace(kube, namespace)


def pods(kube: Kubectl, namespace: str, model: str) -> list[dict[str, Any]]:
    found = kube.items("pods", namespace, f"skiff.dev/model={model}")
    return [p for p in found if not p["metadata"].get("deletionTimestamp")]


def infer(target: str, model: str) -> list[np.ndarray] | None:
    """The model's output for INPUT from the pod at host:port `target` (in a list: truthy); None until it answers."""
    client = triton.InferenceServerClient(target)
    request = triton.InferInput("image", list(INPUT.shape), "FP32")
    request.set_data_from_numpy(INPUT)
    try:
        result = client.infer(model, [request], client_timeout=10)
    except triton.InferenceServerException:
        return None
    finally:
        client.close()
    (name,) = (out["name"] for out in result.get_response(as_json=True)["outputs"])
    return [result.as_numpy(name)]


def pod_answer(kube: Kubectl, namespace: str, model: str, pod: dict[str, Any] | None = None) -> np.ndarray:
    pod = pod or pods(kube, namespace, model)[0]
    target = f"{pod['status']['podIP']}:{contract.GRPC_PORT}"
    (answer,) = eventually(lambda: infer(target, model), timeout=30, what=f"an answer from {model} at {target}")
    return answer


def wait_ready(kube: Kubectl, namespace: str, model: str, timeout_s: float = 420) -> None:
    """The model Ready=True; on a timeout, its pods' phases and container states say where it stopped."""

    def ready() -> bool:
        body = kube.get("inferencemodel", model, "-n", namespace)
        return any(c["type"] == "Ready" and c["status"] == "True" for c in body.get("status", {}).get("conditions", []))

    try:
        eventually(ready, timeout=timeout_s, interval=1, what=f"{model} Ready")
    except TimeoutError:
        print_pods(kube, namespace, model)
        raise


def print_pods(kube: Kubectl, namespace: str, model: str) -> None:
    """Where the model's pods stopped: phase, conditions (PodScheduled says why a Pending pod waits), container
    states, and the model's status."""
    for pod in kube.items("pods", namespace, f"skiff.dev/model={model}"):
        status = pod.get("status", {})
        states = [s.get("state") for s in status.get("initContainerStatuses", []) + status.get("containerStatuses", [])]
        print(f"{pod['metadata']['name']}: {status.get('phase')} {status.get('conditions')} {states}")
    print(f"{model} status: {json.dumps(kube.get('inferencemodel', model, '-n', namespace).get('status'))}")


def fetch_exit_code(pod: dict[str, Any]) -> int | None:
    """The exit code of the pod's fetch-model init container's last run (None: it has not finished one)."""
    for status in pod.get("status", {}).get("initContainerStatuses", []):
        for state in (status.get("state", {}), status.get("lastState", {})):
            if "terminated" in state:
                return int(state["terminated"]["exitCode"])
    return None


def status_version(kube: Kubectl, namespace: str, model: str) -> dict[str, Any]:
    versions = (kube.get("inferencemodel", model, "-n", namespace).get("status") or {}).get("versions") or [{}]
    found: dict[str, Any] = versions[0]
    return found


def test_the_same_model_from_s3_https_and_oci_answers_exactly_as_from_the_pvc(stores: Stores, kube: Kubectl) -> None:
    for model in (PVC, S3, HTTPS, OCI):
        wait_ready(kube, stores.namespace, model)
    expected = pod_answer(kube, stores.namespace, PVC)
    for model in (S3, HTTPS, OCI):
        np.testing.assert_array_equal(pod_answer(kube, stores.namespace, model), expected)
    # Status names what was loaded, by content: the same files from either store have the pvc directory's digest.
    digest = directory_digest(stores.sample)
    assert status_version(kube, stores.namespace, S3)["modelDigest"] == digest
    assert status_version(kube, stores.namespace, S3)["modelUri"] == "s3://models/sample-cnn/v1"
    assert status_version(kube, stores.namespace, HTTPS)["modelDigest"] == digest
    assert "modelDigest" not in status_version(kube, stores.namespace, PVC)
    (pod,) = pods(kube, stores.namespace, S3)
    (init,) = pod["status"]["initContainerStatuses"]
    assert init["state"]["terminated"]["exitCode"] == 0
    assert json.loads(init["state"]["terminated"]["message"])["digest"] == digest
    # oci://: status names the manifest digest the push printed (not a content hash), the init step exited 0.
    assert stores.oci_digest.startswith("sha256:")
    assert stores.oci_digest != digest
    assert status_version(kube, stores.namespace, OCI)["modelDigest"] == stores.oci_digest
    assert status_version(kube, stores.namespace, OCI)["modelUri"] == stores.oci_uri("models/sample-cnn")
    (pod,) = pods(kube, stores.namespace, OCI)
    (init,) = pod["status"]["initContainerStatuses"]
    assert init["state"]["terminated"]["exitCode"] == 0
    assert json.loads(init["state"]["terminated"]["message"])["digest"] == stores.oci_digest


@pytest.mark.parametrize(
    ("model", "reason", "says"),
    [
        (BAD_SUM, "ChecksumMismatch", "sha256"),
        (MISSING, "NotFound", "s3://models/nothing-here/v1"),
        (DENIED, "AccessDenied", "check the keys in spec.storage.s3.secretName"),
    ],
)
def test_a_failed_fetch_is_model_fetch_failed_with_its_reason_and_no_pod_serves(
    stores: Stores, kube: Kubectl, model: str, reason: str, says: str
) -> None:
    def failed() -> dict[str, Any] | None:
        body = kube.get("inferencemodel", model, "-n", stores.namespace)
        if not (body.get("status") or {}).get("conditions"):
            return None
        ready = condition(body, "Ready")
        return ready if ready.get("reason") == "ModelFetchFailed" else None

    try:
        ready = eventually(failed, timeout=300, interval=1, what=f"{model} Ready=False ModelFetchFailed")
    except TimeoutError:
        print_pods(kube, stores.namespace, model)
        raise
    assert ready["status"] == "False"
    assert f"({reason})" in ready["message"], ready
    assert says in ready["message"], ready
    assert "modelDigest" not in status_version(kube, stores.namespace, model)
    (pod,) = pods(kube, stores.namespace, model)
    (runtime,) = pod["status"]["containerStatuses"]
    assert runtime["ready"] is False
    assert "running" not in runtime["state"], runtime  # the runtime never started on a model it did not get
    assert fetch_exit_code(pod) == 1


def test_no_credential_reaches_a_log_an_event_or_status(stores: Stores, kube: Kubectl, real_node: RealNode) -> None:
    for model in (S3, DENIED):  # the fetches with credentials have run (and the denied one has failed)

        def fetched(model: str = model) -> bool:
            return fetch_exit_code(pods(kube, stores.namespace, model)[0]) is not None

        eventually(fetched, timeout=300, what=f"{model}'s fetch to have run")
    logs = {
        "operator log": stores.operator.log(),
        "kubelet log": (real_node.paths.logs / "kubelet.log").read_text(errors="replace"),
        "containerd log": (real_node.paths.logs / "containerd.log").read_text(errors="replace"),
    }
    for path in real_node.paths.pod_logs.glob(f"{stores.namespace}_*/*/*.log"):
        logs[f"container log {path.relative_to(real_node.paths.pod_logs)}"] = path.read_text(errors="replace")
    assert any("fetch-model" in name for name in logs), sorted(logs)
    assert any("fetch:" in text for text in logs.values())  # the fetch step's own log lines are read here
    events = json.dumps(kube.get("events", "-n", stores.namespace))
    statuses = {m: json.dumps(kube.get("inferencemodel", m, "-n", stores.namespace)) for m in (S3, DENIED, MISSING)}
    for secret in (storage.READER.secret_key, WRONG.secret_key):
        for name, text in {**logs, "events": events, **statuses}.items():
            assert secret not in text, f"a secret key in the {name}"
    assert "ModelFetchFailed" in events  # the events were read, and say what failed


def delete_models(kube: Kubectl, namespace: str, models: tuple[str, ...]) -> None:
    """The models deleted and their pods gone (terminating pods hold their CPU: a measurement must not wait on it)."""
    for model in models:
        kube.run("delete", "inferencemodel", model, "-n", namespace, "--wait=true", "--timeout=120s")

    def gone() -> bool:
        labels = [p["metadata"].get("labels", {}) for p in kube.items("pods", namespace)]
        return not [found for found in labels if found.get("skiff.dev/model") in models]

    eventually(gone, timeout=180, what=f"the pods of {', '.join(models)} to be gone")


def first_answer_after_apply(kube: Kubectl, stores: Stores, body: dict[str, Any]) -> float:
    """Seconds from `kubectl apply` of `body` to the first answer from its pod."""
    name = body["metadata"]["name"]
    started = time.monotonic()
    kube.apply(body)
    answered_pod(kube, stores.namespace, name, known=set())
    return time.monotonic() - started


def answered_pod(kube: Kubectl, namespace: str, model: str, known: set[str]) -> str:
    """Waits for a pod of `model` not in `known` to answer INPUT; its name."""

    def answered() -> str | None:
        for pod in pods(kube, namespace, model):
            ip = pod.get("status", {}).get("podIP")
            if pod["metadata"]["name"] not in known and ip and infer(f"{ip}:{contract.GRPC_PORT}", model) is not None:
                return str(pod["metadata"]["name"])
        return None

    return eventually(answered, timeout=600, interval=0.2, what=f"a new pod of {model} to answer")


def test_start_up_of_a_100_mb_model_from_s3_beside_pvc(stores: Stores, kube: Kubectl) -> None:
    delete_models(kube, stores.namespace, (BAD_SUM, MISSING, DENIED, PVC, HTTPS))  # room on the 2-core node
    large = stores.models / "large" / "v1"
    size = write_large_model(large, LARGE_MB)
    stores.s3.upload(large, storage.BUCKET, "large/v1")
    from_s3 = fetched_model(stores, LARGE_S3, "s3://models/large/v1", s3_storage(stores.s3, "s3-reader"))
    from_pvc = real_model(stores.namespace, LARGE_PVC, "pvc://models/large/v1", stores.image)
    from_pvc["spec"]["resources"]["cpu"] = SERVED_CPU
    cold_s3 = first_answer_after_apply(kube, stores, from_s3)
    print(f"START-UP {size / 1e6:.0f} MB model from s3:// (cold): kubectl apply -> first answer {cold_s3:.1f}s")
    pvc = first_answer_after_apply(kube, stores, from_pvc)
    print(f"START-UP {size / 1e6:.0f} MB model from pvc://: kubectl apply -> first answer {pvc:.1f}s")
    np.testing.assert_array_equal(
        pod_answer(kube, stores.namespace, LARGE_S3), pod_answer(kube, stores.namespace, LARGE_PVC)
    )
    # The second pod of the same version (a scale-up), on the same node: it fetches again (no node cache yet).
    (first,) = pods(kube, stores.namespace, LARGE_S3)
    started = time.monotonic()
    kube.run("patch", "inferencemodel", LARGE_S3, "-n", stores.namespace, "--type=json",
             "-p", '[{"op": "replace", "path": "/spec/versions/0/replicas", "value": 2}]')  # fmt: skip
    answered_pod(kube, stores.namespace, LARGE_S3, known={first["metadata"]["name"]})
    second = time.monotonic() - started
    print(f"START-UP {size / 1e6:.0f} MB model, kubectl apply -> first answer: s3:// cold {cold_s3:.1f}s, "
          f"pvc:// {pvc:.1f}s; the s3:// version's second pod (scale 1 -> 2) -> its answer {second:.1f}s")  # fmt: skip
    assert max(cold_s3, pvc, second) < 600
    delete_models(kube, stores.namespace, (LARGE_S3, LARGE_PVC))


def test_start_up_of_a_100_mb_model_from_oci(stores: Stores, kube: Kubectl) -> None:
    large = stores.models / "large" / "v1"  # written by the s3:// measurement (the same files)
    if not large.is_dir():
        write_large_model(large, LARGE_MB)
    size = sum(path.stat().st_size for path in large.rglob("*") if path.is_file())
    started = time.monotonic()
    digest = push(stores.registry, large, "models/large")
    pushed = time.monotonic() - started
    from_oci = fetched_model(stores, LARGE_OCI, stores.oci_uri("models/large"), OCI_STORAGE)
    cold_oci = first_answer_after_apply(kube, stores, from_oci)
    print(f"START-UP {size / 1e6:.0f} MB model from oci:// (cold, registry on the node, plain http): kubectl apply "
          f"-> first answer {cold_oci:.1f}s (pack + push beforehand: {pushed:.1f}s)")  # fmt: skip
    wait_ready(kube, stores.namespace, LARGE_OCI, timeout_s=120)
    assert status_version(kube, stores.namespace, LARGE_OCI)["modelDigest"] == digest
    assert cold_oci < 600
    delete_models(kube, stores.namespace, (LARGE_OCI,))


def test_the_learned_digest_pins_without_a_roll_and_a_changed_object_fails_the_next_pod(
    stores: Stores, kube: Kubectl
) -> None:
    wait_ready(kube, stores.namespace, S3)
    digest = directory_digest(stores.sample)
    config_map = eventually(
        lambda: (kube.get_or_none("configmap", f"{S3}-model-digests", stores.namespace) or {}).get("data"),
        timeout=60, what="the digest ConfigMap's pin",
    )  # fmt: skip
    assert json.loads(config_map["v1"]) == {"uri": "s3://models/sample-cnn/v1", "digest": digest}
    # Learning the digest changed no pod template: the version's one ReplicaSet, its first pod still serving.
    assert len(kube.items("replicasets", stores.namespace, f"skiff.dev/model={S3}")) == 1
    (serving,) = pods(kube, stores.namespace, S3)
    assert serving["status"]["containerStatuses"][0]["restartCount"] == 0
    expected = pod_answer(kube, stores.namespace, S3, serving)

    # The object under the same URI changes; the version's next pod must not serve it.
    params = next(p for p in stores.sample.iterdir() if p.suffix == ".pdiparams")
    changed = bytearray(params.read_bytes())
    changed[-1] ^= 0xFF
    assert stores.s3.put(object_path(storage.BUCKET, f"sample-cnn/v1/{params.name}"), bytes(changed)) == 200
    kube.run("patch", "inferencemodel", S3, "-n", stores.namespace, "--type=json",
             "-p", '[{"op": "replace", "path": "/spec/versions/0/replicas", "value": 2}]')  # fmt: skip

    def refused() -> dict[str, Any] | None:
        body = kube.get("inferencemodel", S3, "-n", stores.namespace)
        degraded = condition(body, "Degraded") if (body.get("status") or {}).get("conditions") else {}
        return degraded if degraded.get("reason") == "ModelFetchFailed" else None

    degraded = eventually(refused, timeout=300, interval=1, what=f"{S3} Degraded=True ModelFetchFailed")
    assert "(ChecksumMismatch): the model at this URI changed" in degraded["message"], degraded
    (new,) = (p for p in pods(kube, stores.namespace, S3) if p["metadata"]["name"] != serving["metadata"]["name"])
    assert not new["status"]["containerStatuses"][0]["ready"], new
    assert fetch_exit_code(new) == 1
    # The first pod still serves what it loaded, and status still names that.
    np.testing.assert_array_equal(pod_answer(kube, stores.namespace, S3, serving), expected)
    assert status_version(kube, stores.namespace, S3)["modelDigest"] == digest
    assert len(kube.items("replicasets", stores.namespace, f"skiff.dev/model={S3}")) == 1  # a scale-up, no roll
