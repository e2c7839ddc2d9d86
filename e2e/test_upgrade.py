"""`helm upgrade` to a new chart build whose CRD changed, against a real API server: chart build A (the chart as
it is) installs the CRD and operator A, three models turn Ready; build B (a copy with a new chart version and
appVersion, another operator image tag and a new optional CRD field) is upgraded onto it by Helm itself. The CRD
takes B's schema, every CR keeps its uid, generation and spec, and after operator B has resynced every model no
Deployment changed generation or template and no pod was replaced. (e2e/test_install.py upgrades only the operator,
with the CRD applied apart from the chart.)

The operator runs as a subprocess with the chart Deployment's exact arguments (kwok runs no containers).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import yaml
from devtools.cluster import Kubectl, eventually
from devtools.helm import CHART, CRD_TEMPLATE, Helm
from devtools.models import load_example

from e2e.harness import RELEASE, ChartOperator, chart_deployment, install_chart, service_account_kubeconfig
from e2e.test_install import CRD_NAME, chart_owned_crd, children_state, wait_ready

__all__ = ["chart_owned_crd"]  # the fixture, used below by name

NEW_FIELD = "upgradeNote"
# Models that name no spec.runtime.image run the chart's runtimeImage; pinned in both builds, so B's new appVersion
# (whose default runtime image would roll them, as values.yaml says) leaves them alone too.
RUNTIME = "ghcr.io/skiff-dev/skiff-runtime:0.1.0"


def chart_build_b(target: Path) -> Path:
    """A copy of the chart as its next release would be: version and appVersion bumped, and the CRD template with
    one more optional field in spec (rendered from the template's own YAML, so everything else is A's)."""
    chart = target / "skiff"
    shutil.copytree(CHART, chart)
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    meta["version"], meta["appVersion"] = "0.1.1-b", "0.1.1-b"
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    lines = CRD_TEMPLATE.read_text().splitlines()
    body = [line for line in lines if not line.lstrip().startswith("{{")]
    crd = yaml.safe_load("\n".join(body))
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert NEW_FIELD not in spec["properties"]
    spec["properties"][NEW_FIELD] = {"type": "string", "maxLength": 64, "description": "Added by chart build B."}
    dumped = yaml.safe_dump(crd, sort_keys=False, width=1000)
    assert "{{" not in dumped
    (chart / "templates" / "crd.yaml").write_text("{{- if .Values.crds.install }}\n" + dumped + "{{- end }}\n")
    return chart


def spec_fields(kube: Kubectl) -> set[str]:
    crd = kube.get("crd", CRD_NAME)
    return set(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"])


def test_helm_upgrade_to_a_chart_with_a_changed_crd_keeps_every_cr_and_running_model(
    kube: Kubectl,
    helm: Helm,
    namespace: str,
    claims: list[str],
    simulated_nodes: None,
    chart_owned_crd: None,
    tmp_path: Path,
) -> None:
    values = [f'watchNamespaces=["{namespace}"]', "operator.resyncSeconds=3", f'runtimeImage="{RUNTIME}"']
    install_chart(helm, namespace, *values, 'image.tag="0.1.0-a"')
    assert kube.get("crd", CRD_NAME)["metadata"]["annotations"]["meta.helm.sh/release-namespace"] == namespace
    assert NEW_FIELD not in spec_fields(kube)
    kubeconfig = service_account_kubeconfig(kube, namespace, RELEASE, tmp_path / "sa.kubeconfig")
    models = [load_example(name, namespace) for name in ("cpu", "canary", "tls")]
    with ChartOperator(chart_deployment(kube, namespace), kubeconfig, tmp_path / "a.log"):
        kube.apply(models)
        for model in models:
            wait_ready(kube, model)
        before = children_state(kube, namespace)
    stored: dict[str, dict[str, Any]] = {
        m["metadata"]["name"]: kube.get("inferencemodel", m["metadata"]["name"], "-n", namespace) for m in models
    }
    assert len(before["deployments"]) == 4
    assert len(before["pods"]) >= 4

    try:
        started = time.monotonic()
        b_values = ('image.tag="0.1.1-b"', 'operator.logLevel="DEBUG"')
        install_chart(helm, namespace, *values, *b_values, command="upgrade", chart=chart_build_b(tmp_path))
        print(f"helm upgrade to build B (CRD changed): {time.monotonic() - started:.1f}s")
        assert NEW_FIELD in spec_fields(kube)  # Helm upgraded the CRD
        kube.run("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
        history = json.loads(helm.run("history", RELEASE, "-n", namespace, "-o", "json").stdout)
        assert [(h["revision"], h["status"], h["app_version"]) for h in history] == [
            (1, "superseded", "0.1.0"),
            (2, "deployed", "0.1.1-b"),
        ]
        for name, old in stored.items():
            new = kube.get("inferencemodel", name, "-n", namespace)
            assert (new["metadata"]["uid"], new["metadata"]["generation"], new["spec"]) == (
                old["metadata"]["uid"],
                old["metadata"]["generation"],
                old["spec"],
            ), name
        deployment = chart_deployment(kube, namespace)
        assert deployment["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":0.1.1-b")
        with ChartOperator(deployment, kubeconfig, tmp_path / "b.log") as operator_b:
            # B has listed and reconciled every model (at DEBUG its log names each one), then one resync more.
            names = [m["metadata"]["name"] for m in models]
            eventually(
                lambda: all(name in operator_b.log() for name in names),
                timeout=60,
                what=f"operator B to reconcile {names}",
            )
            time.sleep(4)
            for model in models:
                wait_ready(kube, model)
            assert children_state(kube, namespace) == before
            # The new field is served: the API server keeps it (an unknown field would be pruned).
            cpu = models[0]["metadata"]["name"]
            kube.run("patch", "inferencemodel", cpu, "-n", namespace, "--type=merge", "-p",
                     json.dumps({"spec": {NEW_FIELD: "from build B"}}))  # fmt: skip
            assert kube.get("inferencemodel", cpu, "-n", namespace)["spec"][NEW_FIELD] == "from build B"
    finally:
        helm.run("uninstall", RELEASE, "--namespace", namespace, "--wait", "--timeout", "60s", check=False)
        # The kept CRD has B's schema: deleted, so the fixture puts crds/ back as the session had it.
        kube.run("delete", "crd", CRD_NAME, "--wait=true", "--timeout=60s")
