"""`make demo`: the whole story on the local cluster of `make up`, from an InferenceModel to an inference.

Builds (once) and starts what `make up` starts (or reuses it when it runs): a Kubernetes control plane on 127.0.0.1
with simulated GPU and CPU nodes, the CRD and the operator, and where this machine can run one a real node with
Traefik as the gateway. On the real node: a canary of the sample model (v1 and v2) runs as real pods, and requests
sent through the gateway are counted per version while the split goes 90/10, 50/50, 0/100. Without one: it applies
manifests/examples/cpu.yaml, starts the runtime exactly as the operator's Deployment describes it (command, env,
probes; volumes and ports mapped to this machine) and runs an inference through it. The cluster stays up for
kubectl until `make down`.

With --ocr (`make demo-ocr`, real node only): manifests/examples/ocr.yaml (PaddleOCR's detection, direction and
recognition as one model, on the PP-OCRv4 weights the runtime image ships) is applied, routed through the gateway,
and rendered images (English, Chinese, an ID card) are read through Traefik; their text is printed beside what the
in-process task reads on the same weights.

Run: .venv/bin/python -m devtools.demo [--ocr]   (from the repository root)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as triton

from devtools.cluster import Kubectl, build_controlplane, eventually
from devtools.install import create_model_claims
from devtools.local_pod import local_pod, start_local_pod, wait_for_startup_probe
from devtools.models import load_example, real_model
from devtools.ocr import ocr_model, read_through, reference_texts, rendered_pngs
from devtools.traffic import answers_per_version, write_sample_model
from devtools.up import STATE_DIR, instructions, node_info, sigterm_as_interrupt, up
from skiff_runtime.client import SkiffClient

NAMESPACE = "skiff-demo"
EXAMPLE = "cpu"
STEPS = 6
CANARY = "scorer"
# The splits the real-node demo walks through, and how many requests it counts through the gateway at each.
SPLITS = ((90, 10), (50, 50), (0, 100))
REQUESTS = 200
CLIENTS = 4
OCR_STEPS = 6
OCR_MODEL = "ocr"  # manifests/examples/ocr.yaml's name


class Steps:
    def __init__(self, total: int = STEPS) -> None:
        self.number = 0
        self.total = total
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        self.number += 1
        print(f"[{self.number}/{self.total}] {message}", flush=True)

    def note(self, message: str) -> None:
        print(f"      {message}", flush=True)


@contextlib.contextmanager
def running(process: subprocess.Popen[bytes], what: str, note: Steps) -> Iterator[subprocess.Popen[bytes]]:
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                code = process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait()
            note.note(f"{what} stopped (exit code {code})")


def watch_until_ready(kube: Kubectl, name: str, step: Steps, timeout_s: float = 180) -> None:
    """Prints `kubectl get im` each time its line changes, until the model is Ready."""
    shown: set[str] = set()  # rows without the AGE column, so only changes are printed
    deadline = time.monotonic() + timeout_s
    header_shown = False
    while time.monotonic() < deadline:
        lines = kube.run("get", "im", name, "-n", NAMESPACE, "-o", "wide").splitlines()
        if not header_shown:
            step.note(lines[0])
            header_shown = True
        if lines[1].rsplit(maxsplit=1)[0] not in shown:
            shown.add(lines[1].rsplit(maxsplit=1)[0])
            step.note(lines[1])
        ready = kube.attempt("wait", "--for=condition=Ready", f"inferencemodel/{name}", "-n", NAMESPACE, "--timeout=1s")
        if ready.returncode == 0:
            line = kube.run("get", "im", name, "-n", NAMESPACE, "-o", "wide").splitlines()[1]
            if line.rsplit(maxsplit=1)[0] not in shown:
                step.note(line)
            return
    raise TimeoutError(f"{name} was not Ready after {timeout_s:.0f}s")


def run_demo(workdir: Path, state_dir: Path = STATE_DIR, *, real_node: bool = True, ocr: bool = False) -> Path:
    """The story, step by step, on the cluster of `make up` in `state_dir`; returns its kubeconfig (it stays up).
    With `real_node` (and a machine that can run one), real pods and traffic through the gateway; with `ocr`, the
    OCR example read through the gateway instead (a real node is required)."""
    step = Steps(OCR_STEPS if ocr else STEPS)
    step("control plane binaries: built once from Go modules into ~/.cache/skiff, reused after that")
    build_controlplane()
    step("make up: control plane on 127.0.0.1 with simulated nodes, the CRD, the operator (all kept running)")
    kubeconfig = up(state_dir, log=step.note, real_node=real_node)
    kube = Kubectl(kubeconfig)
    create_namespace(kube)
    info = node_info(state_dir) if real_node else None
    if ocr:
        if info is None:
            raise SystemExit(
                "make demo-ocr reads images through the gateway on the real node, and this cluster has none: run it "
                "as root on a machine with containerd's tools (make up says why not), without NO_REAL_NODE"
            )
        run_ocr_on_real_node(kube, info, step)
    elif info is not None:
        run_on_real_node(kube, info, step)
    else:
        run_local_pod(kube, workdir, step)
    print(f"done in {time.monotonic() - step.started:.0f}s", flush=True)
    return kubeconfig


def create_namespace(kube: Kubectl) -> None:
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": NAMESPACE, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}},
        }
    )
    eventually(lambda: kube.get_or_none("serviceaccount", "default", NAMESPACE), timeout=60, what="the namespace")


def run_on_real_node(kube: Kubectl, info: dict[str, Any], step: Steps) -> None:
    """A canary of two versions as real pods; requests through Traefik counted per version as the split changes."""
    models = Path(info["shared"]) / NAMESPACE
    step(f"namespace {NAMESPACE} enforces Pod Security 'restricted'; claim 'models' on the real node, two versions")
    for version in ("v1", "v2"):
        if not (models / "scorer" / version / "inference.json").exists():
            models.mkdir(mode=0o755, parents=True, exist_ok=True)
            write_sample_model(models / "scorer" / version)
    if kube.get_or_none("persistentvolumeclaim", "models", NAMESPACE) is None:  # a second demo reuses it
        create_model_claims(kube, NAMESPACE, ["models"], host_dirs={"models": models})
    step.note(f"models: the sample conv net as v1 and v2 in {models} (hostPath volume, claim 'models')")

    body = real_model(NAMESPACE, CANARY, "pvc://models/scorer/v1", info["runtime_image"])
    body["spec"]["versions"] = [
        {"name": v, "modelUri": f"pvc://models/scorer/{v}", "replicas": 1} for v in ("v1", "v2")
    ]
    body["spec"]["traffic"] = traffic(SPLITS[0])
    body["spec"]["resources"] = {"cpu": "250m", "memory": "1Gi"}
    gateway = {"name": info["gateway_name"], "namespace": info["gateway_namespace"], "sectionName": "grpc"}
    body["spec"]["routing"] = {"gateways": [gateway]}
    step(f"kubectl apply: InferenceModel {CANARY!r} (v1 90%, v2 10%) on the real node; kubectl get im until Ready")
    kube.apply(body)
    watch_until_ready(kube, CANARY, step, timeout_s=300)
    for line in kube.run("get", "pods", "-n", NAMESPACE, "-o", "wide").splitlines():
        step.note(line)

    target = info["gateway"]
    step(f"{REQUESTS} requests per split through the gateway (Traefik, {target}; {CLIENTS} clients), per version")
    for split in SPLITS:
        count_split(kube, target, split, step)
    step("the model's status after the splits: kubectl get im -o wide")
    for line in kube.run("get", "im", CANARY, "-n", NAMESPACE, "-o", "wide").splitlines():
        step.note(line)


def run_ocr_on_real_node(kube: Kubectl, info: dict[str, Any], step: Steps) -> None:
    """manifests/examples/ocr.yaml as a real pod behind the gateway; rendered images read through Traefik, their
    text printed beside the in-process task's on the same weights."""
    gateway = {"name": info["gateway_name"], "namespace": info["gateway_namespace"], "sectionName": "grpc"}
    body = ocr_model(NAMESPACE, info["runtime_image"], gateway)
    step(
        f"kubectl apply -f manifests/examples/ocr.yaml -n {NAMESPACE} (modelUri packaged://pp-ocrv4: the weights "
        "are in the runtime image), routed through the gateway; kubectl get im until Ready"
    )
    kube.apply(body)
    reference = subprocess_reference()
    watch_until_ready(kube, OCR_MODEL, step, timeout_s=420)
    status = kube.get("im", OCR_MODEL, "-n", NAMESPACE)["status"]
    for version in status.get("versions", []):
        loaded = ", ".join(f"{s['name']} ({s['path']}) loaded={s['loaded']}" for s in version.get("subModels", []))
        step.note(f"status.versions[{version['name']}].subModels: {loaded}")

    target = info["gateway"]
    step(f"rendered images read through the gateway (Traefik, {target}) with tritonclient: PNG bytes in, text out")
    client = triton.InferenceServerClient(target)
    try:
        pngs = rendered_pngs()

        def first_read() -> bool:  # Traefik programs the route a moment after the model is Ready
            with contextlib.suppress(triton.InferenceServerException):
                return bool(read_through(client, OCR_MODEL, pngs["english"]).texts)
            return False

        eventually(first_read, timeout=60, interval=1, what=f"an OCR answer through the gateway at {target}")
        step("each image's text through the gateway, and whether it equals the in-process task's line for line")
        expected = reference.result()
        for name, png in pngs.items():
            read = read_through(client, OCR_MODEL, png)
            same = "same as in process" if read.texts == expected[name] else f"in process: {expected[name]}"
            step.note(f"{name}: {len(read.texts)} line(s) from version {read.version} in {read.seconds * 1000:.0f} ms "
                      f"({same})")  # fmt: skip
            for text, score, corner in zip(read.texts, read.scores, read.corners, strict=True):
                step.note(f"  {score:.3f} at [{corner[0]:.0f}, {corner[1]:.0f}]: {text}")
        step(f"the model's status: kubectl get im {OCR_MODEL} -o wide")
        for line in kube.run("get", "im", OCR_MODEL, "-n", NAMESPACE, "-o", "wide").splitlines():
            step.note(line)
    finally:
        client.close()


def subprocess_reference() -> concurrent.futures.Future[dict[str, list[str]]]:
    """The in-process task's text, computed beside the pod's start (devtools.ocr.reference_texts)."""
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    future = executor.submit(reference_texts)
    executor.shutdown(wait=False)
    return future


def traffic(split: tuple[int, int]) -> list[dict[str, Any]]:
    return [{"version": "v1", "percent": split[0]}, {"version": "v2", "percent": split[1]}]


def count_split(kube: Kubectl, target: str, split: tuple[int, int], step: Steps) -> Counter[str]:
    """The split patched in and applied (the status says it, and Traefik sends about that share), then REQUESTS
    requests through the gateway counted per version."""
    kube.run(
        "patch", "im", CANARY, "-n", NAMESPACE, "--type=merge", "-p", json.dumps({"spec": {"traffic": traffic(split)}})
    )
    wanted = f"v1={split[0]},v2={split[1]}"
    eventually(
        lambda: kube.get("im", CANARY, "-n", NAMESPACE).get("status", {}).get("trafficSplit") == wanted,
        timeout=120,
        interval=0.5,
        what=f"status.trafficSplit {wanted}",
    )

    def applied() -> bool:
        """Traefik reads the route (and a new version's endpoints) a moment after the status says it: 20 requests
        (one connection, weighted round robin) give v1 within 15 points of its share, and reach exactly the
        versions with a share, once it has (a 90/10 answered only by v1 is Traefik without v2 yet)."""
        with contextlib.suppress(Exception):  # no answer yet: Traefik is updating
            sample = answers_per_version(target, CANARY, clients=1, requests=20)
            reached = all((sample[v] > 0) == (share > 0) for v, share in zip(("v1", "v2"), split, strict=True))
            return abs(sample["v1"] * 5 - split[0]) <= 15 and reached
        return False

    eventually(applied, timeout=60, interval=0.5, what=f"the gateway to apply {wanted}")
    started = time.monotonic()
    counted = answers_per_version(target, CANARY, clients=CLIENTS, requests=REQUESTS)
    seconds = time.monotonic() - started
    shares = ", ".join(f"{v} {counted[v]} ({counted[v] * 100 / REQUESTS:.0f}%)" for v in ("v1", "v2"))
    step.note(f"split {wanted:<12} -> {shares} in {seconds:.1f}s")
    return counted


def run_local_pod(kube: Kubectl, workdir: Path, step: Steps) -> None:
    """The example on simulated nodes; its runtime started from the Deployment's pod spec as a local process."""
    body = load_example(EXAMPLE, NAMESPACE)
    name = body["metadata"]["name"]
    claim, _, subpath = body["spec"]["versions"][0]["modelUri"].removeprefix("pvc://").partition("/")
    step(f"namespace {NAMESPACE} enforces Pod Security 'restricted'; claim {claim!r} Bound")
    if kube.get_or_none("persistentvolumeclaim", claim, NAMESPACE) is None:  # a second demo reuses it
        create_model_claims(kube, NAMESPACE, [claim])

    step(f"kubectl apply -f manifests/examples/{EXAMPLE}.yaml -n {NAMESPACE}; kubectl get im -o wide until Ready")
    kube.apply(body)
    watch_until_ready(kube, name, step)
    for line in kube.run("get", "pods", "-n", NAMESPACE, "-o", "wide").splitlines():
        step.note(line)
    deployment = kube.get("deployment", f"{name}-v1", "-n", NAMESPACE)

    step("runtime from the Deployment's pod spec, as a local process (the nodes are simulated)")
    claim_root = workdir / f"pvc-{claim}"
    subprocess.run(
        [sys.executable, "-m", "skiff_runtime.samples", "conv", str(claim_root / subpath)],
        check=True,
        capture_output=True,
    )
    step.note(f"model: the sample 10-class conv net, exported into the claim {claim!r} at {subpath}")
    scratch = workdir / "pod"
    scratch.mkdir()
    pod = local_pod(deployment, claim_roots={claim: claim_root}, scratch=scratch)
    step.note(f"command: {' '.join(deployment['spec']['template']['spec']['containers'][0]['command'])}")
    step.note("env: " + " ".join(f"{k}={v}" for k, v in pod.env.items()))
    step.note(f"ports (container -> local): {pod.ports}")
    runtime = start_local_pod(pod, scratch, workdir / "runtime.log")
    with running(runtime, "runtime", step):
        target, service = pod.probe_target("startupProbe")
        seconds = wait_for_startup_probe(pod, runtime)
        step.note(f"startup probe grpc.health.v1 Check(service={service!r}) on {target}: SERVING after {seconds:.1f}s")

        step("inference through the runtime with skiff_runtime.client.SkiffClient")
        with SkiffClient(f"127.0.0.1:{pod.port_of('grpc')}") as client:
            inputs, _ = client.metadata(name)
            images = np.random.default_rng(0).random((1, 3, 32, 32), dtype=np.float32)
            started = time.perf_counter()
            outputs = client.infer(name, {inputs[0].name: images}, timeout_s=30)
            elapsed_ms = (time.perf_counter() - started) * 1000
        (probabilities,) = outputs.values()
        top = int(probabilities[0].argmax())
        step.note(f"model {name!r}: class {top} with p={probabilities[0][top]:.4f} in {elapsed_ms:.1f} ms")
        step.note(f"probabilities {np.array2string(probabilities[0], precision=3)}")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep-files", action="store_true", help="keep the runtime's log and model files")
    parser.add_argument("--no-real-node", action="store_true", help="simulated nodes only, even as root")
    parser.add_argument("--ocr", action="store_true", help="the OCR example through the gateway (real node only)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, sigterm_as_interrupt)
    workdir = Path(tempfile.mkdtemp(prefix="skiff-demo-"))
    try:
        kubeconfig = run_demo(workdir, real_node=not args.no_real_node, ocr=args.ocr)
    except KeyboardInterrupt:
        print("interrupted; the runtime was stopped (the cluster of `make up` stops with: make down)", file=sys.stderr)
        return 130
    finally:
        if args.keep_files:
            print(f"files kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nThe cluster stays up; the demo's model: kubectl get im -n {NAMESPACE}")
    print(instructions(kubeconfig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
