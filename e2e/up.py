"""`make up` / `make down`: a local control plane, the CRD and the operator that keep running until `make down`.

`make up` starts kwokctl's control plane on 127.0.0.1 (simulated GPU, MIG and CPU nodes), installs the CRD,
creates the claims the examples mount in the namespace "default" and starts `skiff-operator run --all-namespaces`
in the background. Everything lives in one state folder (.cache/up: the kubeconfig, the control plane's files, the
operator's pid and log), so `make down` finds and stops all of it, and a second `make up` reuses a running one.

Run: .venv/bin/python -m e2e.up [up|down|status]   (from the repository root)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from e2e.cluster import (
    BUILD_HINT,
    REPO,
    Kubectl,
    LocalControlPlane,
    Log,
    build_controlplane,
    controlplane_bin_dir,
    controlplane_built,
    eventually,
)
from e2e.harness import OPERATOR, create_model_claims, install_crd

STATE_DIR = REPO / ".cache" / "up"
CLUSTER_NAME = "skiff-up"
NAMESPACE = "default"
CLAIMS = ["models", "fraud-models"]  # the claims manifests/examples/*.yaml mount
OPERATOR_ARGS = ("run", "--all-namespaces", "--standalone")
CANARY_PATCH = '{"spec":{"traffic":[{"version":"v1","percent":50},{"version":"v2","percent":50}]}}'


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


def start_operator(kube: Kubectl, state_dir: Path, log: Log) -> int:
    """`skiff-operator run --all-namespaces --standalone` in its own session, outliving this process."""
    log_path = state_dir / "operator.log"
    with log_path.open("ab") as out:
        process = subprocess.Popen(
            [OPERATOR, *OPERATOR_ARGS],
            env={**kube.env, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    (state_dir / "operator.pid").write_text(str(process.pid))
    time.sleep(3)  # an operator that cannot start (bad kubeconfig, missing RBAC) exits within this
    if process.poll() is not None:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the operator exited with code {process.returncode}; the end of {log_path}:\n{tail}")
    log(f"operator running (pid {process.pid}), watching every namespace; log: {log_path}")
    return process.pid


def up(state_dir: Path = STATE_DIR, log: Log = _print) -> Path:
    """Starts the control plane, the CRD, the example claims and the operator, unless they already run.
    Returns the kubeconfig. A running cluster whose operator has stopped gets its operator back (the models
    stay); leftovers of a stopped or broken earlier run are removed first."""
    if cluster_answers(state_dir):
        if operator_pid(state_dir) is None:
            log("the cluster is up but its operator is not running: starting it again")
            start_operator(Kubectl(kubeconfig_path(state_dir)), state_dir, log)
        else:
            log(f"already up (state in {state_dir})")
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
        start_operator(kube, state_dir, log)
    except BaseException:
        down(state_dir, log)
        raise
    return kubeconfig_path(state_dir)


def down(state_dir: Path = STATE_DIR, log: Log = _print) -> None:
    """Stops the operator and the control plane `up` started and removes the state folder."""
    pid = operator_pid(state_dir)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        try:
            eventually(lambda: operator_pid(state_dir) is None, timeout=15, interval=0.2, what="the operator to exit")
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
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

Pods here are simulated (kwok plays the kubelet), so they serve nothing: `make demo` serves a model for real.
The operator's log: {kubeconfig.parent.parent / "operator.log"}.  Stop everything: make down
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.up", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["up", "down", "status"], nargs="?", default="up")
    args = parser.parse_args(argv)
    if args.command == "down":
        if not STATE_DIR.exists():
            print("nothing to stop (no .cache/up)")
            return 0
        down()
        print("down: the operator and the control plane are stopped, .cache/up is removed")
        return 0
    if args.command == "status":
        running = is_up()
        print(f"up: {kubeconfig_path(STATE_DIR)}" if running else "down (make up starts it)")
        return 0 if running else 1
    signal.signal(signal.SIGTERM, sigterm_as_interrupt)
    build_controlplane()
    try:
        kubeconfig = up()
    except KeyboardInterrupt:
        print("interrupted; everything started was stopped", file=sys.stderr)
        return 130
    print(instructions(kubeconfig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
