"""`make up` / `make down`: a local control plane, the CRD and the operator that keep running until `make down`.

`make up` starts kwokctl's control plane on 127.0.0.1 (simulated GPU, MIG and CPU nodes), installs the CRD,
creates the claims the examples mount in the namespace "default" and starts `skiff-operator run --all-namespaces`
in the background. Where this machine can run one (root, containerd; devtools/node/), a real node joins too, with
Traefik serving a Gateway on 127.0.0.1, SeaweedFS serving S3 on the node's address (the sample model in
s3://models/sample-cnn/v1, docs/storage.md) and a docker-registry there (plain http, port 5000: the sample model as
oci://10.250.0.1:5000/models/sample-cnn:v1, manifests/examples/oci.yaml): a background process
(`python -m devtools.up node`) holds them and removes them on `make down`. Everything lives in one state folder
(.cache/up: the kubeconfig, the control plane's files, the pids and logs), so `make down` finds and stops all of it,
and a second `make up` reuses a running one.

Run: .venv/bin/python -m devtools.up [up|down|status] [--no-real-node]   (from the repository root)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from devtools import storage
from devtools.cluster import (
    BUILD_HINT,
    REAL_NODE_IP,
    REPO,
    Kubectl,
    LocalControlPlane,
    Log,
    build_controlplane,
    controlplane_bin_dir,
    controlplane_built,
    eventually,
    free_port,
)
from devtools.gateway import INSTALL_HINT as TRAEFIK_HINT
from devtools.gateway import Traefik, gateway_manifests, install_gateway_api, traefik_binary
from devtools.install import OPERATOR, create_model_claims, install_crd
from skiff_runtime.fetch.oci import OciAccess
from skiff_runtime.fetch.pack import push_model
from skiff_runtime.fetch.sigv4 import Credentials
from skiff_runtime.fetch.source import Limits
from skiff_runtime.fetch.transfer import Transport

STATE_DIR = REPO / ".cache" / "up"
CLUSTER_NAME = "skiff-up"
NAMESPACE = "default"
CLAIMS = ["models", "fraud-models", "ernie-trt-cache"]  # the claims manifests/examples/*.yaml mount
OPERATOR_ARGS = ("run", "--all-namespaces", "--standalone")
CANARY_PATCH = '{"spec":{"traffic":[{"version":"v1","percent":50},{"version":"v2","percent":50}]}}'
GATEWAY = "public"  # in NAMESPACE, accepting routes from every namespace; Traefik serves it on 127.0.0.1
NODE_INFO = "node.json"  # written by the node process once the node and the gateway are ready
S3_SECRET = "s3-reader"  # manifests/examples/s3.yaml's spec.storage.s3.secretName
SAMPLE_PREFIX = "sample-cnn/v1"  # the sample model in the S3 server's bucket (manifests/examples/s3.yaml)
NODE_START_TIMEOUT_S = 1200  # a cold image build takes minutes (scripts/images.sh), a cached start seconds


def _print(message: str) -> None:
    print(message, flush=True)


def sigterm_as_interrupt(signum: int, frame: FrameType | None) -> None:
    """`kill PID` stops a run as Ctrl-C does: through the code that tears down what was started."""
    raise KeyboardInterrupt


def kubeconfig_path(state_dir: Path) -> Path:
    return state_dir / "controlplane" / "kubeconfig"


def control_plane(state_dir: Path, log: Log) -> LocalControlPlane:
    return LocalControlPlane(controlplane_bin_dir(), log=log, name=CLUSTER_NAME, workdir=state_dir / "controlplane")


def cluster_answers(state_dir: Path) -> bool:
    """The API server behind the state folder's kubeconfig is ready."""
    kubeconfig = kubeconfig_path(state_dir)
    if not kubeconfig.is_file():
        return False
    done = Kubectl(kubeconfig).attempt("get", "--raw", "/readyz", timeout=10)
    return done.returncode == 0


def operator_pid(state_dir: Path) -> int | None:
    """The pid of the operator `make up` started, while that process is still running."""
    with contextlib.suppress(OSError, ValueError):
        pid = int((state_dir / "operator.pid").read_text().strip())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        if any(arg.endswith("skiff-operator") for arg in argv) and all(arg in argv for arg in OPERATOR_ARGS):
            return pid
    return None


def is_up(state_dir: Path = STATE_DIR) -> bool:
    return cluster_answers(state_dir) and operator_pid(state_dir) is not None


def node_pid(state_dir: Path) -> int | None:
    """The pid of the process holding `make up`'s real node, while it runs."""
    with contextlib.suppress(OSError, ValueError):
        pid = int((state_dir / "node.pid").read_text().strip())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        if "devtools.up" in argv and "node" in argv:
            return pid
    return None


def node_info(state_dir: Path = STATE_DIR) -> dict[str, Any] | None:
    """What the node process wrote once its real node and gateway were ready (None without a real node): the
    gateway's address, the directory pods may mount (hostPath), the runtime image imported there."""
    path = state_dir / NODE_INFO
    if node_pid(state_dir) is None or not path.exists():
        return None
    info: dict[str, Any] = json.loads(path.read_text())
    return info


def real_node_problem_here(state_dir: Path) -> str | None:
    """Why `make up` cannot add a real node on this machine (None when it can)."""
    from devtools.node.real_node import real_node_problem  # the node's module needs root's tools only when used

    if traefik_binary() is None:
        return f"the gateway needs traefik; run: {TRAEFIK_HINT}"
    return real_node_problem(Kubectl(kubeconfig_path(state_dir)), control_plane(state_dir, _print))


def start_node_process(state_dir: Path, log: Log) -> None:
    """`python -m devtools.up node` in its own session: builds the images when needed (its progress shown here), starts
    the real node and Traefik and keeps them until SIGTERM (`make down`)."""
    log_path = state_dir / "node.log"
    argv = [sys.executable, "-m", "devtools.up", "node", "--state", str(state_dir)]
    process = spawn_detached(state_dir, "node", argv, dict(os.environ))
    shown = 0
    deadline = time.monotonic() + NODE_START_TIMEOUT_S
    while not (state_dir / NODE_INFO).exists():
        text = log_path.read_text(errors="replace")
        for line in text[shown:].splitlines():
            log(f"  {line}")
        shown = len(text)
        if process.poll() is not None:
            raise RuntimeError(f"the real node's process exited with {process.returncode}; its log: {log_path}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the real node was not ready after {NODE_START_TIMEOUT_S}s; its log: {log_path}")
        time.sleep(0.5)
    info = json.loads((state_dir / NODE_INFO).read_text())
    log(f"real node Ready (pid {process.pid}); Traefik serves Gateway {NAMESPACE}/{GATEWAY} on {info['gateway']}")


def serve_node(state_dir: Path) -> int:
    """The node process: the real node and Traefik, until SIGTERM; then both removed (the node leaves nothing)."""
    from devtools.node.real_node import start_real_node

    signal.signal(signal.SIGTERM, sigterm_as_interrupt)
    kube = Kubectl(kubeconfig_path(state_dir))
    node = start_real_node(kube, log=_print, plane=control_plane(state_dir, _print))
    traefik: Traefik | None = None
    stores = contextlib.ExitStack()
    try:
        port = free_port()
        gateway = gateway_manifests(NAMESPACE, GATEWAY, port)
        gateway[1]["spec"]["listeners"][0]["allowedRoutes"] = {"namespaces": {"from": "All"}}
        kube.apply(gateway)
        traefik = Traefik(kube, port, state_dir / "traefik.log")
        traefik.start(NAMESPACE, GATEWAY)
        s3 = stores.enter_context(start_model_store(kube, state_dir / "s3"))
        oci = stores.enter_context(start_registry(state_dir / "registry", state_dir / "s3" / "sample-cnn"))
        info = {
            "gateway": f"127.0.0.1:{port}",
            "gateway_name": GATEWAY,
            "gateway_namespace": NAMESPACE,
            "shared": str(node.paths.shared),
            "runtime_image": node.images[0].name,
            "s3": s3.url,
            "oci": oci,
        }
        (state_dir / f"{NODE_INFO}.new").write_text(json.dumps(info))
        (state_dir / f"{NODE_INFO}.new").rename(state_dir / NODE_INFO)
        while True:
            signal.pause()
    except KeyboardInterrupt:
        return 0
    finally:
        (state_dir / NODE_INFO).unlink(missing_ok=True)
        stores.close()
        if traefik is not None:
            traefik.stop()
        left = node.stop()
        print(f"real node stopped; left on the machine: {left or 'nothing'}", flush=True)


@contextlib.contextmanager
def start_model_store(kube: Kubectl, workdir: Path) -> Iterator[storage.S3Server]:
    """SeaweedFS's S3 server on the node's address (pods reach it; nothing off this machine does), the sample model
    in s3://models/sample-cnn/v1 and the Secret S3_SECRET with the read-only identity in NAMESPACE: what
    manifests/examples/s3.yaml and docs/storage.md fetch from."""
    from devtools.traffic import write_sample_model  # Paddle's exporter: in the node process only

    with storage.seaweedfs(workdir, REAL_NODE_IP, storage.UP_S3_PORT) as s3:
        write_sample_model(workdir / "sample-cnn")
        size = s3.upload(workdir / "sample-cnn", storage.BUCKET, SAMPLE_PREFIX)
        kube.apply(s3_secret(NAMESPACE, S3_SECRET, storage.READER))
        _print(f"S3 (SeaweedFS) on {s3.url}: s3://{storage.BUCKET}/{SAMPLE_PREFIX} ({size:,} B); Secret {S3_SECRET}")
        yield s3


@contextlib.contextmanager
def start_registry(workdir: Path, sample: Path) -> Iterator[str]:
    """docker-registry on the node's address (plain http), the sample model `sample` pushed as
    models/sample-cnn:v1 (manifests/examples/oci.yaml); its oci:// URI, or "" without docker-registry (a hint)."""
    if shutil.which("docker-registry") is None:
        _print(f"no OCI registry: {storage.REGISTRY_HINT} (then make down && make up)")
        yield ""
        return
    with storage.docker_registry(workdir, REAL_NODE_IP, storage.UP_REGISTRY_PORT) as registry:
        uri = f"oci://{registry.address}/models/sample-cnn:v1"
        packed = push_model(sample, uri, OciAccess(insecure=True), Transport(Limits()))
        _print(f"OCI registry (docker-registry, plain http) on {registry.address}: {uri} ({packed.digest})")
        yield uri


def s3_secret(namespace: str, name: str, credentials: Credentials) -> dict[str, Any]:
    """The Secret spec.storage.s3.secretName names: the keys the fetch-model init container reads."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": "Opaque",
        "stringData": {"AWS_ACCESS_KEY_ID": credentials.access_key, "AWS_SECRET_ACCESS_KEY": credentials.secret_key},
    }


def spawn_detached(state_dir: Path, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """argv in its own session (it outlives this process), logging to NAME.log; its pid in NAME.pid."""
    with (state_dir / f"{name}.log").open("ab") as out:
        process = subprocess.Popen(
            argv,
            cwd=REPO,
            env={**env, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    (state_dir / f"{name}.pid").write_text(str(process.pid))
    return process


def start_operator(kube: Kubectl, state_dir: Path, log: Log) -> int:
    """`skiff-operator run --all-namespaces --standalone` in its own session, outliving this process."""
    log_path = state_dir / "operator.log"
    process = spawn_detached(state_dir, "operator", [OPERATOR, *OPERATOR_ARGS], kube.env)
    time.sleep(3)  # an operator that cannot start (bad kubeconfig, missing RBAC) exits within this
    if process.poll() is not None:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the operator exited with code {process.returncode}; the end of {log_path}:\n{tail}")
    log(f"operator running (pid {process.pid}), watching every namespace; log: {log_path}")
    return process.pid


def up(state_dir: Path = STATE_DIR, log: Log = _print, *, real_node: bool = False) -> Path:
    """Starts the control plane, the CRD, the example claims and the operator, unless they already run, and with
    `real_node` a real node and Traefik (when this machine can run them; otherwise it says why and goes on).
    Returns the kubeconfig. A running cluster whose operator has stopped gets its operator back (the models
    stay); leftovers of a stopped or broken earlier run are removed first."""
    if cluster_answers(state_dir):
        if operator_pid(state_dir) is None:
            log("the cluster is up but its operator is not running: starting it again")
            start_operator(Kubectl(kubeconfig_path(state_dir)), state_dir, log)
        else:
            log(f"already up (state in {state_dir})")
        if real_node and node_pid(state_dir) is None:
            add_real_node(state_dir, log)
        return kubeconfig_path(state_dir)
    if not controlplane_built():
        raise FileNotFoundError(f"the local control plane is not built; run: {BUILD_HINT}")
    if state_dir.exists():
        log(f"removing what an earlier `make up` left in {state_dir}")
        down(state_dir, log)
    state_dir.mkdir(parents=True)
    plane = control_plane(state_dir, log)
    try:
        kube = plane.start()
        install_crd(kube, field_manager="skiff-up")
        log("CRD inferencemodels.skiff.dev Established")
        eventually(lambda: kube.get_or_none("serviceaccount", "default", NAMESPACE), timeout=60, what="namespace")
        create_model_claims(kube, NAMESPACE, CLAIMS)
        log(f"claims {', '.join(CLAIMS)} Bound in namespace {NAMESPACE} (the examples mount them)")
        if real_node:
            install_gateway_api(kube)  # before the operator starts: it routes through a Gateway only with the CRDs
            log("Gateway API CRDs Established")
        start_operator(kube, state_dir, log)
        if real_node:
            add_real_node(state_dir, log)
    except BaseException:
        down(state_dir, log)
        raise
    return kubeconfig_path(state_dir)


def add_real_node(state_dir: Path, log: Log) -> None:
    problem = real_node_problem_here(state_dir)
    if problem:
        log(f"no real node: {problem}; pods stay simulated")
        return
    if kube_has_no_gateway_api(state_dir):
        install_gateway_api(Kubectl(kubeconfig_path(state_dir)))
    start_node_process(state_dir, log)


def kube_has_no_gateway_api(state_dir: Path) -> bool:
    kube = Kubectl(kubeconfig_path(state_dir))
    return kube.get_or_none("crd", "grpcroutes.gateway.networking.k8s.io", "default") is None


def stop_detached(state_dir: Path, find: Callable[[Path], int | None], timeout: float) -> int | None:
    """SIGTERM to the process `find` names (SIGKILL after `timeout`), waited for; its pid, or None if none ran."""
    pid = find(state_dir)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        try:
            eventually(lambda: find(state_dir) is None, timeout=timeout, interval=0.2, what=f"pid {pid} to exit")
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
    return pid


def down(state_dir: Path = STATE_DIR, log: Log = _print) -> None:
    """Stops the real node, the operator and the control plane `up` started and removes the state folder."""
    # The node first: it drains its pods through the API server, then removes itself (seconds).
    pid = stop_detached(state_dir, node_pid, timeout=180)
    if pid is not None:
        log(f"real node stopped and removed (pid {pid}); its log: {state_dir / 'node.log'}")
    pid = stop_detached(state_dir, operator_pid, timeout=15)
    if pid is not None:
        log(f"operator (pid {pid}) stopped")
    if (state_dir / "controlplane").exists():
        control_plane(state_dir, log).stop()
    shutil.rmtree(state_dir, ignore_errors=True)


def instructions(kubeconfig: Path) -> str:
    """What `make up` prints: how to point kubectl at the cluster and three things to try."""
    venv_bin = Path(sys.executable).parent
    return f"""
Skiff is up: a control plane on 127.0.0.1 with simulated GPU, MIG and CPU nodes, the InferenceModel CRD and the
operator. In your shell:

  export KUBECONFIG={kubeconfig}
  export PATH="{venv_bin}:$PATH"   # kubectl v1.36, as the control plane

Three things to try:
  kubectl apply -f manifests/examples/canary.yaml   # fraud-scorer: v1 takes 90% of the traffic, v2 10%
  kubectl get im -o wide                            # Ready, the versions, the traffic split (and pods, deploy)
  kubectl patch im fraud-scorer --type merge -p '{CANARY_PATCH}'

{pods_note(kubeconfig.parent.parent)}
The operator's log: {kubeconfig.parent.parent / "operator.log"}.  Stop everything: make down
"""


def pods_note(state_dir: Path) -> str:
    info = node_info(state_dir)
    if info is None:
        return "Pods here are simulated (kwok plays the kubelet), so they serve nothing: `make demo` serves a model."
    gateway = f"{info['gateway_namespace']}/{info['gateway_name']}"
    return f"""A real node runs too (containerd, kubelet, kube-proxy; pods on 10.244.0.0/24): pods that select the label
skiff.dev/real-node and tolerate its taint run there, with the runtime image {info["runtime_image"]}
(`make demo` does it). Traefik serves the Gateway {gateway} on {info["gateway"]}. SeaweedFS serves S3 on
{info["s3"]} (bucket models, the sample model at sample-cnn/v1, Secret {S3_SECRET}): docs/storage.md."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.up", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["up", "down", "status", "node"], nargs="?", default="up")
    parser.add_argument("--no-real-node", action="store_true", help="simulated nodes only, even as root")
    parser.add_argument("--state", type=Path, default=STATE_DIR, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.command == "node":  # the background process `up` starts
        return serve_node(args.state)
    if args.command == "down":
        if not STATE_DIR.exists():
            print("nothing to stop (no .cache/up)")
            return 0
        down()
        print("down: the real node (if any), the operator and the control plane are stopped, .cache/up is removed")
        return 0
    if args.command == "status":
        running = is_up()
        print(f"up: {kubeconfig_path(STATE_DIR)}" if running else "down (make up starts it)")
        return 0 if running else 1
    signal.signal(signal.SIGTERM, sigterm_as_interrupt)
    build_controlplane()
    try:
        kubeconfig = up(real_node=not args.no_real_node)
    except KeyboardInterrupt:
        print("interrupted; everything started was stopped", file=sys.stderr)
        return 130
    print(instructions(kubeconfig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
