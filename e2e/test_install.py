"""The chart against a real API server: `helm install` creates the CRD, the ServiceAccount and the RBAC; the
operator, logged in with a token of the chart's ServiceAccount and nothing else, reconciles a model with no 403;
with one rule removed it gets Forbidden (the negative control, so these tests can catch an RBAC gap); the chart's
operator pod and the runtime pods are admitted under Pod Security "restricted"; upgrade and uninstall work.

The operator runs here as a subprocess (kwok runs no containers) with exactly the arguments of the Deployment the
chart installed, its liveness URL and metrics port moved to free local ports.
"""

from __future__ import annotations

import base64
import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from devtools.cluster import Kubectl, eventually, user_kubeconfig
from devtools.helm import Helm, HelmError
from devtools.install import CRD_PATH, install_crd
from devtools.models import load_example

from e2e.harness import (
    RELEASE,
    ChartOperator,
    chart_deployment,
    forbidden_lines,
    install_chart,
    service_account_kubeconfig,
)

CRD_NAME = "inferencemodels.skiff.dev"


def priority_level(kubeconfig: Path, path: str) -> str:
    """The uid of the API Priority and Fairness level the API server put a GET of `path` on, as its response header
    says; the user is the kubeconfig's token (the request may be refused: it is classified first)."""
    config = yaml.safe_load(kubeconfig.read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    context = ssl.create_default_context(cafile=cluster.get("certificate-authority"))
    if "certificate-authority-data" in cluster:
        context.load_verify_locations(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    request = urllib.request.Request(cluster["server"] + path, headers={"Authorization": f"Bearer {user['token']}"})
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return str(response.headers["X-Kubernetes-PF-PriorityLevel-UID"])
    except urllib.error.HTTPError as error:
        return str(error.headers["X-Kubernetes-PF-PriorityLevel-UID"])


def operator_pod_running(kube: Kubectl, namespace: str) -> dict[str, Any]:
    """The chart's operator pod, admitted under the namespace's Pod Security level and Running (kwok)."""

    def running() -> dict[str, Any] | None:
        pods = kube.items("pod", namespace, "app.kubernetes.io/component=operator")
        return next((p for p in pods if p["status"].get("phase") == "Running"), None)

    return eventually(running, timeout=60, what=f"the chart's operator pod in {namespace}")


def wait_ready(kube: Kubectl, model: dict[str, Any]) -> None:
    """`kubectl wait --for=condition=Ready`; on a timeout, the model, its Deployments and pods are printed."""
    name, namespace = model["metadata"]["name"], model["metadata"]["namespace"]
    done = kube.attempt("wait", "--for=condition=Ready", f"inferencemodel/{name}", "-n", namespace, "--timeout=90s")
    if done.returncode != 0:
        print(kube.run("get", "inferencemodel,deployment,pod,event", "-n", namespace, "-o", "yaml"))
        raise AssertionError(f"{name} not Ready: {done.stderr}")


def test_namespaced_install_runs_the_operator_with_only_its_rbac(
    kube: Kubectl, helm: Helm, namespace: str, claims: list[str], simulated_nodes: None, tmp_path: Path
) -> None:
    assert kube.get("namespace", namespace)["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    notes = install_chart(
        helm, namespace, f'watchNamespaces=["{namespace}"]', "crds.install=false", "operator.resyncSeconds=10"
    )
    assert f"kubectl -n {namespace} rollout status deployment/{RELEASE}" in notes
    assert "crds.install=false" in notes

    account = kube.get("serviceaccount", RELEASE, "-n", namespace)["metadata"]["name"]
    role = kube.get("role", RELEASE, "-n", namespace)
    assert kube.get("rolebinding", RELEASE, "-n", namespace)["subjects"][0]["name"] == account
    cluster_role = kube.get("clusterrole", f"{RELEASE}-{namespace}"[:63])
    assert [r["resources"] for r in cluster_role["rules"]] == [["customresourcedefinitions"], ["namespaces"]]
    assert kube.get("clusterrolebinding", f"{RELEASE}-{namespace}"[:63])["subjects"][0]["namespace"] == namespace
    assert {"inferencemodels", "deployments", "services"} <= {x for r in role["rules"] for x in r["resources"]}
    operator_pod_running(kube, namespace)

    # What the chart grants, and only that: `kubectl auth can-i` as the ServiceAccount.
    kubeconfig = service_account_kubeconfig(kube, namespace, account, tmp_path / "sa.kubeconfig")
    as_account = Kubectl(kubeconfig, kube.binary)
    assert as_account.run("auth", "can-i", "patch", "deployments", "-n", namespace).strip() == "yes"
    assert as_account.attempt("auth", "can-i", "patch", "deployments", "-n", "default").stdout.strip() == "no"
    assert as_account.attempt("auth", "can-i", "get", "secrets", "-n", "kube-system").stdout.strip() == "no"

    # API Priority and Fairness: the operator's requests run on the chart's level, its Lease on the built-in
    # leader-election level, and another ServiceAccount of the namespace (the negative control) on workload-low.
    own = f"{RELEASE}-{namespace}"[:63]
    level = {
        n: kube.get("prioritylevelconfiguration", n)["metadata"]["uid"]
        for n in (own, "leader-election", "workload-low")
    }
    models = f"/apis/skiff.dev/v1alpha1/namespaces/{namespace}/inferencemodels"
    assert priority_level(kubeconfig, models) == level[own]
    lease = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{RELEASE}-leader"
    assert priority_level(kubeconfig, lease) == level["leader-election"]
    other = service_account_kubeconfig(kube, namespace, "default", tmp_path / "default.kubeconfig")
    assert priority_level(other, models) == level["workload-low"]

    model = load_example("cpu", namespace)
    with ChartOperator(chart_deployment(kube, namespace), kubeconfig, tmp_path / "operator.log") as operator:
        kube.apply(model)
        wait_ready(kube, model)
        eventually(operator.healthy, timeout=10, what="the operator's liveness endpoint")
        # The runtime pods the operator created were admitted under "restricted" too, and run (kwok).
        pods = kube.items("pod", namespace, f"skiff.dev/model={model['metadata']['name']}")
        assert len(pods) == model["spec"]["versions"][0]["replicas"]
        assert all(p["status"]["phase"] == "Running" for p in pods)
        assert forbidden_lines(operator.log(), kube, model) == []
        assert "Ran out of valid credentials" not in operator.log()


def test_one_rule_removed_is_forbidden_and_helm_upgrade_restores_it(
    kube: Kubectl, helm: Helm, namespace: str, claims: list[str], simulated_nodes: None, tmp_path: Path
) -> None:
    install_chart(
        helm, namespace, f'watchNamespaces=["{namespace}"]', "crds.install=false", "operator.resyncSeconds=10"
    )
    # The negative control: the same install without the rule for Deployments.
    role = kube.get("role", RELEASE, "-n", namespace)
    role["rules"] = [r for r in role["rules"] if r["resources"] != ["deployments"]]
    kube.run("replace", "-f", "-", stdin=json.dumps(role))
    kubeconfig = service_account_kubeconfig(kube, namespace, RELEASE, tmp_path / "sa.kubeconfig")

    model = load_example("cpu", namespace)
    name = model["metadata"]["name"]
    with ChartOperator(chart_deployment(kube, namespace), kubeconfig, tmp_path / "operator.log") as operator:
        kube.apply(model)
        eventually(
            lambda: forbidden_lines(operator.log(), kube, model),
            timeout=60,
            what="Forbidden in the operator's log or the model's status",
        )
        assert any("deployments" in line for line in forbidden_lines(operator.log(), kube, model))
        assert kube.items("deployment", namespace, f"skiff.dev/model={name}") == []

    # helm upgrade with changed values. Helm 4 applies server-side: the hand edit of the Role is a conflict it
    # refuses to overwrite, and --force-conflicts takes the Role back. The Deployment takes the new values.
    values = (
        f'watchNamespaces=["{namespace}"]',
        "crds.install=false",
        'operator.logLevel="DEBUG"',
        'operator.resources={"requests":{"cpu":"50m","memory":"200Mi"},"limits":{"memory":"300Mi"}}',
    )
    with pytest.raises(HelmError, match='conflict with "kubectl-replace"'):
        install_chart(helm, namespace, *values, command="upgrade")
    install_chart(helm, namespace, *values, command="upgrade", extra=("--force-conflicts",))
    container = chart_deployment(kube, namespace)["spec"]["template"]["spec"]["containers"][0]
    assert "--log-level=DEBUG" in container["args"]
    assert container["resources"] == {"requests": {"cpu": "50m", "memory": "200Mi"}, "limits": {"memory": "300Mi"}}
    assert ["deployments"] in [r["resources"] for r in kube.get("role", RELEASE, "-n", namespace)["rules"]]
    operator_pod_running(kube, namespace)
    history = json.loads(helm.run("history", RELEASE, "-n", namespace, "-o", "json").stdout)
    assert [(h["revision"], h["status"]) for h in history] == [(1, "superseded"), (2, "failed"), (3, "deployed")]

    helm.run("uninstall", RELEASE, "--namespace", namespace, "--wait", "--timeout", "60s")
    for kind, name_, ns in [
        ("serviceaccount", RELEASE, namespace),
        ("role", RELEASE, namespace),
        ("deployment", RELEASE, namespace),
    ]:
        assert kube.get_or_none(kind, name_, ns) is None, f"{kind} {name_} survived helm uninstall"
    assert kube.attempt("get", "clusterrole", f"{RELEASE}-{namespace}"[:63]).returncode != 0


def children_state(kube: Kubectl, namespace: str) -> dict[str, Any]:
    """What a restart or a re-render would change: every model Deployment's uid, generation and pod template, every
    model pod's uid, every Secret's resourceVersion (a reissued certificate is a new version)."""
    deployments = kube.items("deployment", namespace, "app.kubernetes.io/managed-by=skiff-operator")
    pods = kube.items("pod", namespace, "app.kubernetes.io/managed-by=skiff-operator")
    secrets = kube.items("secret", namespace, "app.kubernetes.io/managed-by=skiff-operator")
    return {
        "deployments": {
            d["metadata"]["name"]: (d["metadata"]["uid"], d["metadata"]["generation"], d["spec"]["template"])
            for d in deployments
        },
        "pods": sorted(p["metadata"]["uid"] for p in pods),
        "secrets": {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in secrets},
    }


def test_helm_upgrade_to_a_new_operator_and_a_crd_change_leave_running_models_alone(
    kube: Kubectl, helm: Helm, namespace: str, claims: list[str], simulated_nodes: None, tmp_path: Path
) -> None:
    """Operator A with three models Ready (one with operator-written TLS Secrets), then `helm upgrade` to operator B
    (another image tag and log level; the operator process replaced): after B has resynced every model, no
    Deployment changed generation or template, no pod was replaced, no certificate reissued. Then a CRD change (a
    new optional field, as a chart upgrade would bring) keeps every CR, and B still acts on an edit."""
    values = [f'watchNamespaces=["{namespace}"]', "crds.install=false", "operator.resyncSeconds=3"]
    install_chart(helm, namespace, *values, 'image.tag="0.1.0-a"')
    kubeconfig = service_account_kubeconfig(kube, namespace, RELEASE, tmp_path / "sa.kubeconfig")
    models = [load_example(name, namespace) for name in ("cpu", "canary", "tls")]
    with ChartOperator(chart_deployment(kube, namespace), kubeconfig, tmp_path / "a.log"):
        kube.apply(models)
        for model in models:
            wait_ready(kube, model)
        before = children_state(kube, namespace)
    assert len(before["deployments"]) == 4
    assert len(before["pods"]) >= 4
    assert len(before["secrets"]) >= 2  # the TLS model's CA and server certificate

    install_chart(helm, namespace, *values, 'image.tag="0.1.0-b"', 'operator.logLevel="DEBUG"', command="upgrade")
    deployment = chart_deployment(kube, namespace)
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":0.1.0-b")
    with ChartOperator(deployment, kubeconfig, tmp_path / "b.log") as operator_b:
        # Two resync periods: B has listed and reconciled every model (its log names each one).
        time.sleep(8)
        for model in models:
            assert model["metadata"]["name"] in operator_b.log(), f"operator B never reconciled {model['metadata']}"
            wait_ready(kube, model)
        assert children_state(kube, namespace) == before

        # A CRD change: a new optional field in spec. Every CR keeps its uid and generation and stays Ready.
        stored = {
            m["metadata"]["name"]: kube.get("inferencemodel", m["metadata"]["name"], "-n", namespace) for m in models
        }
        changed = yaml.safe_load(CRD_PATH.read_text())
        spec_schema = changed["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        spec_schema["properties"]["upgradeNote"] = {"type": "string", "maxLength": 64}
        try:
            kube.run("apply", "--server-side", "--field-manager=skiff-e2e", "-f", "-", stdin=json.dumps(changed))
            kube.run("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
            time.sleep(4)
            for name, old in stored.items():
                new = kube.get("inferencemodel", name, "-n", namespace)
                assert (new["metadata"]["uid"], new["metadata"]["generation"]) == (
                    old["metadata"]["uid"],
                    old["metadata"]["generation"],
                ), name
                assert new["spec"] == old["spec"], name
            assert children_state(kube, namespace) == before
            # B still acts: an edit of one model reaches its Deployment; the others stay as they were.
            cpu = models[0]["metadata"]["name"]
            kube.run("patch", "inferencemodel", cpu, "-n", namespace, "--type=json", "-p",
                     '[{"op": "replace", "path": "/spec/versions/0/replicas", "value": 3}]')  # fmt: skip
            eventually(
                lambda: kube.get("deployment", f"{cpu}-v1", "-n", namespace)["spec"]["replicas"] == 3,
                timeout=30,
                what="operator B to apply the edit",
            )
            after = children_state(kube, namespace)
            assert set(before["pods"]) <= set(after["pods"]), "an edit of replicas replaced running pods"
            unchanged = {k: v for k, v in after["deployments"].items() if not k.startswith(f"{cpu}-")}
            assert unchanged == {k: v for k, v in before["deployments"].items() if not k.startswith(f"{cpu}-")}
        finally:
            install_crd(kube)


@pytest.fixture
def chart_owned_crd(kube: Kubectl) -> Iterator[None]:
    """Removes the CRD the session installed from crds/, so the chart creates it; afterwards the CRD is the
    chart's (kept on uninstall) or, whatever happened, crds/ applied again and published."""
    if user_kubeconfig() is not None:
        pytest.skip("would delete the InferenceModel CRD (and every model) of the user's cluster; local only")
    kube.run("delete", "crd", CRD_NAME, "--wait=true", "--timeout=60s")
    try:
        yield
    finally:
        install_crd(kube)


def test_cluster_wide_install_creates_the_crd_and_uninstall_keeps_it(
    kube: Kubectl,
    helm: Helm,
    namespace: str,
    claims: list[str],
    simulated_nodes: None,
    chart_owned_crd: None,
    tmp_path: Path,
) -> None:
    assert kube.attempt("get", "crd", CRD_NAME).returncode != 0
    install_chart(helm, namespace, "operator.resyncSeconds=10", "clusterWide=true")
    try:
        crd = kube.get("crd", CRD_NAME)
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert crd["metadata"]["annotations"]["meta.helm.sh/release-namespace"] == namespace
        assert (
            crd["spec"]["versions"][0]["schema"]
            == yaml.safe_load(CRD_PATH.read_text())["spec"]["versions"][0]["schema"]
        )
        kube.run("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
        cluster_role = kube.get("clusterrole", f"{RELEASE}-{namespace}"[:63])
        assert {"inferencemodels", "deployments", "customresourcedefinitions"} <= {
            x for r in cluster_role["rules"] for x in r["resources"]
        }
        assert kube.attempt("get", "role", RELEASE, "-n", namespace).returncode != 0
        operator_pod_running(kube, namespace)

        kubeconfig = service_account_kubeconfig(kube, namespace, RELEASE, tmp_path / "sa.kubeconfig")
        model = load_example("cpu", namespace)
        deployment = chart_deployment(kube, namespace)
        assert "--all-namespaces" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        with ChartOperator(deployment, kubeconfig, tmp_path / "operator.log") as operator:
            kube.apply(model)
            wait_ready(kube, model)
            assert forbidden_lines(operator.log(), kube, model) == []
    except BaseException:  # a cluster-wide release left behind refuses every later test's models (its policy)
        helm.run("uninstall", RELEASE, "--namespace", namespace, "--wait", "--timeout", "60s", check=False)
        raise

    helm.run("uninstall", RELEASE, "--namespace", namespace, "--wait", "--timeout", "60s")
    assert kube.get_or_none("serviceaccount", RELEASE, namespace) is None
    assert kube.get("crd", CRD_NAME)["metadata"]["name"] == CRD_NAME, "helm uninstall deleted the kept CRD"
    assert kube.get("inferencemodel", model["metadata"]["name"], "-n", namespace)["metadata"]["name"]
