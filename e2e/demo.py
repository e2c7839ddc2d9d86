"""`make demo`: the whole story on the local cluster of `make up`, from an InferenceModel to an inference.

Builds (once) and starts what `make up` starts (or reuses it when it runs): a Kubernetes control plane on 127.0.0.1
with simulated GPU and CPU nodes, the CRD and the operator. Then it applies manifests/examples/cpu.yaml in the
namespace skiff-demo, shows `kubectl get im` until Ready, starts the runtime exactly as the operator's Deployment
describes it (command, env, probes; volumes and ports mapped to this machine) and runs an inference through it.
The runtime stops at the end; the cluster stays up for kubectl until `make down`.

Run: .venv/bin/python -m e2e.demo   (from the repository root)
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from e2e.cluster import Kubectl, build_controlplane, eventually
from e2e.harness import (
    create_model_claims,
    load_example,
    local_pod,
    start_local_pod,
    wait_for_startup_probe,
)
from e2e.up import STATE_DIR, instructions, sigterm_as_interrupt, up
from skiff_runtime.client import SkiffClient

NAMESPACE = "skiff-demo"
EXAMPLE = "cpu"
STEPS = 6


class Steps:
    def __init__(self) -> None:
        self.number = 0
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        self.number += 1
        print(f"[{self.number}/{STEPS}] {message}", flush=True)

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


def run_demo(workdir: Path, state_dir: Path = STATE_DIR) -> Path:
    """The story, step by step, on the cluster of `make up` in `state_dir`; returns its kubeconfig (it stays up)."""
    step = Steps()
    step("control plane binaries: built once from Go modules into ~/.cache/skiff, reused after that")
    build_controlplane()
    step("make up: control plane on 127.0.0.1 with simulated nodes, the CRD, the operator (all kept running)")
    kubeconfig = up(state_dir, log=step.note)
    kube = Kubectl(kubeconfig)

    body = load_example(EXAMPLE, NAMESPACE)
    name = body["metadata"]["name"]
    claim, _, subpath = body["spec"]["versions"][0]["modelUri"].removeprefix("pvc://").partition("/")
    step(f"namespace {NAMESPACE} enforces Pod Security 'restricted'; claim {claim!r} Bound")
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": NAMESPACE, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}},
        }
    )
    eventually(lambda: kube.get_or_none("serviceaccount", "default", NAMESPACE), timeout=60, what="the namespace")
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
    print(f"done in {time.monotonic() - step.started:.0f}s", flush=True)
    return kubeconfig


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep-files", action="store_true", help="keep the runtime's log and model files")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, sigterm_as_interrupt)
    workdir = Path(tempfile.mkdtemp(prefix="skiff-demo-"))
    try:
        kubeconfig = run_demo(workdir)
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
