"""Fixtures for the e2e suite: the cluster (once per session), the CRD, a fresh namespace per test with the
PersistentVolumeClaims the examples mount, and the operator as a real `skiff-operator run` subprocess.

Without a cluster these tests skip, saying what to run; with SKIFF_E2E_REQUIRED=1 (set by `make test` and CI)
they fail instead, so a skip can never stand in for a pass.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from devtools.cluster import (
    BUILD_HINT,
    Kubectl,
    LocalControlPlane,
    cluster,
    controlplane_built,
    eventually,
    local_control_plane,
    missing_simulated_nodes,
    user_kubeconfig,
)
from devtools.helm import HELM_HINT, Helm, helm_binary
from devtools.install import CRD_PATH, create_model_claims, install_crd
from devtools.node.real_node import RealNode, real_node_problem, start_real_node
from devtools.vendor import gateway_api_crd

from e2e.harness import RESTRICTED, OperatorProcess, running_operator

# The modules that need only the control plane and helm (kwok's simulated nodes): scripts/test.sh runs them beside
# the unit suites while the real node's images and tools still build. Every other module (a new one too, until it
# is listed here) is marked `tools`: it may need the real node, the images, Prometheus, Jaeger or the NetworkPolicy
# engine, so it runs once everything is built.
SIMULATED_ONLY = frozenset(
    f"test_{name}.py"
    for name in (
        "autoscaling", "canary", "crd", "drift", "faults", "fetched_model", "fuzz_bodies", "hostile_bodies",
        "install", "leader_election", "operator", "operator_requests", "pod_contract", "rollout", "security",
        "service_ips", "split_truth", "status_on_failure", "tls", "up", "upgrade", "validation",
    )
)  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    e2e_dir = Path(__file__).parent
    for item in items:
        path = Path(str(item.fspath))
        if e2e_dir in path.parents:
            item.add_marker(pytest.mark.cluster)
            if path.name not in SIMULATED_ONLY:
                item.add_marker(pytest.mark.tools)


@pytest.fixture(scope="session")
def kube() -> Iterator[Kubectl]:
    """kubectl for the cluster in $SKIFF_E2E_KUBECONFIG, else a local control plane ($KUBECONFIG is ignored)."""
    if user_kubeconfig() is None and not controlplane_built():
        reason = f"no cluster: the local control plane is not built; run: {BUILD_HINT}"
        reason += " (or set $SKIFF_E2E_KUBECONFIG to a cluster the tests may use)"
        if os.environ.get("SKIFF_E2E_REQUIRED") == "1":
            pytest.fail(reason + " (SKIFF_E2E_REQUIRED=1: e2e tests must run)", pytrace=False)
        pytest.skip(reason)
    with cluster() as client:
        yield client


@pytest.fixture(scope="session")
def controlplane_binaries() -> None:
    """The local control plane is built: tests that start their own (make up, make demo) need it."""
    if not controlplane_built():
        reason = f"the local control plane is not built; run: {BUILD_HINT}"
        if os.environ.get("SKIFF_E2E_REQUIRED") == "1":
            pytest.fail(reason + " (SKIFF_E2E_REQUIRED=1: e2e tests must run)", pytrace=False)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def helm(kube: Kubectl) -> Helm:
    """helm bound to the cluster's kubeconfig (test_install.py, test_security.py)."""
    binary = helm_binary()
    if binary is None:
        pytest.fail(f"helm not found; run: {HELM_HINT}", pytrace=False)
    return Helm(binary, kubeconfig=kube.kubeconfig)


@pytest.fixture(scope="session")
def crd(kube: Kubectl) -> dict[str, Any]:
    """The InferenceModel CRD, applied from crds/ and Established."""
    install_crd(kube)
    document: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return document


@pytest.fixture
def namespace(kube: Kubectl, crd: dict[str, Any], request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace that enforces Pod Security "restricted", deleted (with everything in it) afterwards."""
    name = f"e2e-{request.node.name[:40].lower()}"
    name = "".join(c if c.isalnum() else "-" for c in name).strip("-")[:50] + "-" + uuid.uuid4().hex[:6]
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": {RESTRICTED: "restricted", "skiff.dev/e2e": "true"}},
        }
    )
    # The ServiceAccount admission plugin rejects pods until the controller manager has made "default".
    eventually(
        lambda: kube.get_or_none("serviceaccount", "default", name), timeout=60, what=f"serviceaccount {name}/default"
    )
    yield name
    kube.run("delete", "namespace", name, "--wait=false", "--ignore-not-found")
    kube.run("delete", "persistentvolume", "-l", f"skiff.dev/e2e-namespace={name}", "--wait=false")


@pytest.fixture
def plane(kube: Kubectl) -> LocalControlPlane:
    """The local control plane this session started: its audit log and its API server process (tests that count
    requests or kill the API server need one)."""
    found = local_control_plane(kube)
    if found is None:
        pytest.fail("this test needs the local control plane's audit log and processes (unset SKIFF_E2E_KUBECONFIG)")
    return found


@pytest.fixture
def claims(kube: Kubectl, namespace: str) -> list[str]:
    """The claims the examples mount (modelUris: "models", "fraud-models"; gpu.yaml's TensorRT engine cache:
    "ernie-trt-cache"), Bound."""
    names = ["models", "fraud-models", "ernie-trt-cache"]
    create_model_claims(kube, namespace, names)
    return names


@pytest.fixture(scope="session")
def simulated_nodes(kube: Kubectl) -> None:
    """The nodes kwok simulates (a GPU node, a MIG node, a CPU node): the local control plane has them; a
    cluster of the user's needs kwok running and `python -m devtools.cluster add-nodes --kubeconfig PATH`."""
    missing = missing_simulated_nodes(kube)
    if missing:
        reason = f"the cluster lacks the simulated nodes {missing}; run kwok in it, then:"
        reason += " python -m devtools.cluster add-nodes --kubeconfig $SKIFF_E2E_KUBECONFIG"
        if os.environ.get("SKIFF_E2E_REQUIRED") == "1":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


@pytest.fixture
def operator(kube: Kubectl, namespace: str, simulated_nodes: None, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator watching the test's namespace; its log is printed when the test fails."""
    with running_operator(kube, namespace, tmp_path / "operator.log") as process:
        yield process


@pytest.fixture(scope="session")
def real_node(kube: Kubectl, pytestconfig: pytest.Config) -> Iterator[RealNode]:
    """A real node (containerd, kubelet, kube-proxy; devtools/node/) joined to the local control plane, with the
    runtime image (scripts/images.sh, cached) imported. Stopped at the end; the teardown fails if it left a trace."""
    problem = real_node_problem(kube)
    if problem:
        if os.environ.get("SKIFF_E2E_REQUIRED") == "1":
            pytest.fail(problem + " (SKIFF_E2E_REQUIRED=1: the real-node tests must run)", pytrace=False)
        pytest.skip(problem)
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        node = start_real_node(kube, log=print)
    try:
        yield node
    finally:
        left = node.stop()  # measured under the host lock: another session's node cannot be mistaken for ours
        assert not left, f"the real node left these on the machine: {left}"


# The standard-channel CRDs a GRPCRoute and its parent Gateway need (devtools.gateway installs all seven Traefik
# watches; these tests want the operator to see only these).
GRPC_ROUTE_CRDS = ("gatewayclasses", "gateways", "grpcroutes", "referencegrants")


@pytest.fixture
def gateway_api(kube: Kubectl) -> None:
    """The Gateway API CRDs a GRPCRoute needs, installed server-side (idempotent) and Established."""
    for path in map(gateway_api_crd, GRPC_ROUTE_CRDS):
        kube.run("apply", "--server-side", "--field-manager=skiff-e2e", "-f", str(path))
    for name in GRPC_ROUTE_CRDS:
        kube.run("wait", "--for=condition=Established", f"crd/{name}.gateway.networking.k8s.io", "--timeout=60s")
