"""The chart rendered by `helm template`: scope (every namespace vs listed ones), RBAC, image, resources, the
restricted pod, the ServiceMonitor, the values schema; and the files generated from it or copied into it."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml
from devtools.helm import CHART, CRD_SOURCE, KEEP, Helm, HelmError, documents, generated_files

from skiff_operator.kinds import CHILD_KINDS, KINDS, Pruned

ALL_RULE_RESOURCES = {
    "inferencemodels",
    "inferencemodels/status",
    "deployments",
    "replicasets",
    "services",
    "pods",
    "events",
    "persistentvolumeclaims",
    "secrets",
    "networkpolicies",
    "poddisruptionbudgets",
    "certificates",
    "grpcroutes",
    "httproutes",
    "backendtlspolicies",
    "configmaps",
}
NAMESPACES_READ = {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}
CRD_READ = {
    "apiGroups": ["apiextensions.k8s.io"],
    "resources": ["customresourcedefinitions"],
    "verbs": ["get", "list", "watch"],
}


def render(helm: Helm, *set_json: str, namespace: str = "skiff-system") -> list[dict[str, Any]]:
    return documents(helm.template(*set_json, namespace=namespace))


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = of_kind(docs, kind)
    assert len(found) == 1, f"{len(found)} {kind}s rendered"
    return found[0]


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def served(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The Roles (or RoleBindings) of the served namespaces, without the leader election's."""
    return [d for d in of_kind(docs, kind) if not d["metadata"]["name"].endswith("-leader")]


def rule_resources(rules: list[dict[str, Any]]) -> set[str]:
    return {resource for rule in rules for resource in rule["resources"]}


@pytest.mark.parametrize(
    "set_json",
    [(), ('watchNamespaces=["ml","nlp"]', "serviceMonitor.enabled=true", "crds.install=false")],
    ids=["defaults", "namespaced-with-servicemonitor"],
)
def test_lint_strict_is_clean(helm: Helm, set_json: tuple[str, ...]) -> None:
    args = [a for pair in set_json for a in ("--set-json", pair)]
    done = helm.run("lint", "--strict", str(CHART), *args)
    assert "0 chart(s) failed" in done.stdout
    assert "[WARNING]" not in done.stdout
    assert "[ERROR]" not in done.stdout


@pytest.mark.parametrize(
    ("pair", "message"),
    [
        ('operator.logLevl="DEBUG"', "additional properties 'logLevl' not allowed"),
        ('image.tgs="1"', "additional properties 'tgs' not allowed"),
        ('watchNamespace=["ml"]', "additional properties 'watchNamespace' not allowed"),
        ("serviceMonitor.enable=true", "additional properties 'enable' not allowed"),
        ('operator.resources.requests.cpus="1"', "additional properties 'cpus' not allowed"),
        ('operator.logLevel="LOUD"', "operator/logLevel"),
        ('watchNamespaces=["Not_A_Namespace"]', "watchNamespaces/0"),
    ],
)
def test_schema_rejects_typos_and_bad_values(helm: Helm, pair: str, message: str) -> None:
    with pytest.raises(HelmError) as error:
        helm.template(pair)
    assert message in error.value.stderr


def test_kube_version_below_1_30_is_refused(helm: Helm) -> None:
    """The admission policy is admissionregistration.k8s.io/v1, GA in 1.30 (FlowSchema v1: 1.29)."""
    with pytest.raises(HelmError, match="kubeVersion"):
        helm.run("template", "x", str(CHART), "--kube-version", "1.29.9")
    helm.run("template", "x", str(CHART), "--kube-version", "1.30.0")


def test_one_kind_per_template_file(helm: Helm) -> None:
    rendered = helm.template('watchNamespaces=["ml","nlp"]', "serviceMonitor.enabled=true")
    kinds: dict[str, set[str]] = {}
    for chunk in rendered.split("\n---\n"):
        source = re.search(r"^# Source: (\S+)", chunk, re.MULTILINE)
        body = yaml.safe_load(chunk)
        if source and body:
            kinds.setdefault(source.group(1), set()).add(body["kind"])
    assert len(kinds) >= 8
    assert all(len(k) == 1 for k in kinds.values()), kinds


def test_default_scope_is_the_release_namespace_with_a_role_there(helm: Helm) -> None:
    """Least privilege by default: one Role in the release namespace; the ClusterRole only reads CRDs and
    namespaces (no cluster-wide Secrets, Pods or children)."""
    docs = render(helm)
    (role,) = served(docs, "Role")
    (binding,) = served(docs, "RoleBinding")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "skiff-system"
    assert rule_resources(role["rules"]) == ALL_RULE_RESOURCES
    assert one(docs, "ClusterRole")["rules"] == [CRD_READ, NAMESPACES_READ]
    args = container(docs)["args"]
    assert "--all-namespaces" not in args
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=skiff-system"]


def test_cluster_wide_is_an_opt_in_with_the_same_verbs_in_one_cluster_role(helm: Helm) -> None:
    docs = render(helm, "clusterWide=true")
    assert served(docs, "Role") == []
    assert served(docs, "RoleBinding") == []
    role = one(docs, "ClusterRole")
    assert CRD_READ in role["rules"]
    assert NAMESPACES_READ in role["rules"]
    assert rule_resources(role["rules"]) == ALL_RULE_RESOURCES | {"customresourcedefinitions", "namespaces"}
    (namespaced_role,) = served(render(helm), "Role")
    namespaced = namespaced_role["rules"]
    assert [r for r in role["rules"] if r not in (CRD_READ, NAMESPACES_READ)] == namespaced
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    account = one(docs, "ServiceAccount")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "skiff-system"}
    ]
    args = container(docs)["args"]
    assert "--all-namespaces" in args
    assert not any(a.startswith("--namespace") for a in args)


def test_listed_namespaces_get_a_role_each_and_the_cluster_role_only_reads_crds(helm: Helm) -> None:
    docs = render(helm, 'watchNamespaces=["ml","nlp"]', namespace="ops")
    roles = {r["metadata"]["namespace"]: r for r in served(docs, "Role")}
    bindings = {b["metadata"]["namespace"]: b for b in served(docs, "RoleBinding")}
    assert set(roles) == set(bindings) == {"ml", "nlp"}
    for namespace, role in roles.items():
        assert rule_resources(role["rules"]) == ALL_RULE_RESOURCES
        assert bindings[namespace]["roleRef"]["name"] == role["metadata"]["name"]
        assert bindings[namespace]["subjects"][0]["namespace"] == "ops"
    assert one(docs, "ClusterRole")["rules"] == [CRD_READ, NAMESPACES_READ]
    args = container(docs)["args"]
    assert "--all-namespaces" not in args
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=ml", "--namespace=nlp"]


def test_rules_are_explicit_no_wildcards(helm: Helm) -> None:
    for docs in (render(helm), render(helm, 'watchNamespaces=["ml"]')):
        for role in of_kind(docs, "ClusterRole") + of_kind(docs, "Role"):
            for rule in role["rules"]:
                assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule


def test_rules_cover_every_resource_docs_operator_md_names(helm: Helm) -> None:
    """docs/operator.md lists what the operator uses (`- `resource[.group]` ...: verbs`); each resource named there
    must be in the chart's rules (kopfpeerings excepted: the chart runs the operator --standalone)."""
    text = (CHART.parents[1] / "docs" / "operator.md").read_text()
    section = text.split("The operator's RBAC needs", 1)[1].split(":\n", 1)[1].split("\n#", 1)[0]
    named = set()
    for line in section.splitlines():
        if line.startswith("- "):
            named |= {token.split(".")[0] for token in re.findall(r"`([^`]+)`", line.split(":", 1)[0])}
    named -= {"kopfpeerings"}
    assert {"inferencemodels", "deployments", "services", "pods", "events", "grpcroutes", "secrets", "leases"} <= named
    docs = render(helm)
    granted = {resource for role in of_kind(docs, "Role") for resource in rule_resources(role["rules"])}
    assert named <= granted | rule_resources(one(docs, "ClusterRole")["rules"])
    assert "--standalone" in container(render(helm))["args"]


def granted_verbs(rules: list[dict[str, Any]], group: str, resource: str) -> set[str]:
    return {v for r in rules if group in r["apiGroups"] and resource in r["resources"] for v in r["verbs"]}


@pytest.mark.parametrize("scope", [(), ('watchNamespaces=["ml"]',)], ids=["namespace", "listed-namespaces"])
def test_every_kind_the_operator_writes_or_lists_is_granted_the_verbs_it_uses(helm: Helm, scope: tuple[str]) -> None:
    """skiff_operator.kinds is the one table of what the operator touches: an applied kind needs get, create and
    patch (server-side apply, and the by-name ownership look-up), a listed child list, a pruned one delete. A kind
    added there without its rule fails here, not as a 403 on a cluster where its CRD happens to be served."""
    docs = render(helm, *scope)
    rules = [rule for role in served(docs, "Role") for rule in role["rules"]]
    assert rules, "no Role of a served namespace rendered"
    for kind in KINDS:
        needed = {
            *({"get", "create", "patch"} if kind.applied else set()),
            *({"list"} if kind in CHILD_KINDS else set()),
            *({"delete"} if kind.pruned is not Pruned.NEVER else set()),
        }
        assert needed <= granted_verbs(rules, kind.group, kind.plural), f"{kind.plural}.{kind.group}: {needed}"
    # The negative control: a rule table without httproutes misses exactly that kind.
    without = [{**r, "resources": [x for x in r["resources"] if x != "httproutes"]} for r in rules]
    assert not {"list"} <= granted_verbs(without, "gateway.networking.k8s.io", "httproutes")


def test_image_defaults_to_app_version_and_can_be_overridden(helm: Helm) -> None:
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert container(render(helm))["image"] == f"ghcr.io/skiff-dev/skiff-operator:{app_version}"
    overridden = container(
        render(helm, 'image.repository="registry.local/ops"', 'image.tag="dev-1"', 'image.pullPolicy="Always"')
    )
    assert overridden["image"] == "registry.local/ops:dev-1"
    assert overridden["imagePullPolicy"] == "Always"


def test_resources_default_and_override(helm: Helm) -> None:
    assert container(render(helm))["resources"] == {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"memory": "512Mi"},
    }
    custom = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}}
    assert container(render(helm, f"operator.resources={json.dumps(custom)}"))["resources"] == custom


def test_deployment_is_two_replicas_with_a_restricted_pod(helm: Helm) -> None:
    deployment = one(render(helm), "Deployment")
    assert deployment["spec"]["replicas"] == 2
    # One pod at a time is replaced; with the leader handing its Lease back on SIGTERM, the standby takes over.
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 1, "maxSurge": 0}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert pod["serviceAccountName"] == one(render(helm), "ServiceAccount")["metadata"]["name"]


@pytest.mark.parametrize("port", [8080, 9321])
def test_liveness_probe_checks_the_endpoint_the_operator_serves(helm: Helm, port: int) -> None:
    c = container(render(helm, f"operator.livenessPort={port}"))
    assert f"--liveness=http://0.0.0.0:{port}/healthz" in c["args"]
    assert c["ports"][0] == {"name": "liveness", "containerPort": port, "protocol": "TCP"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "liveness"}


@pytest.mark.parametrize("port", [8081, 9400])
def test_the_operators_metrics_port_is_served_exposed_and_scraped_when_asked(helm: Helm, port: int) -> None:
    docs = render(helm, f"operator.metricsPort={port}")
    c = container(docs)
    assert f"--metrics-port={port}" in c["args"]
    assert {"name": "metrics", "containerPort": port, "protocol": "TCP"} in c["ports"]
    [service] = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"].endswith("-operator-metrics")]
    assert service["spec"]["ports"] == [{"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"}]
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert not [d for d in docs if d["kind"] == "ServiceMonitor"]  # off by default
    monitors = [d for d in render(helm, "serviceMonitor.enabled=true") if d["kind"] == "ServiceMonitor"]
    [operator] = [m for m in monitors if m["metadata"]["name"].endswith("-operator")]
    assert operator["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert operator["spec"]["endpoints"][0]["port"] == "metrics"
    assert operator["spec"]["namespaceSelector"] == {"matchNames": ["skiff-system"]}


def test_replicas_elect_a_leader_on_one_lease_they_alone_may_update(helm: Helm) -> None:
    docs = render(helm, "operator.replicas=3")
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    args = container(docs)["args"]
    assert "--leader-elect" in args
    lease = next(a.split("=", 1)[1] for a in args if a.startswith("--lease-name="))
    env = {e["name"]: e for e in container(docs)["env"]}
    assert env["SKIFF_OPERATOR_POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    (role,) = [r for r in of_kind(docs, "Role") if r["metadata"]["name"] == lease]
    assert role["metadata"]["namespace"] == "skiff-system"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [lease],
            "verbs": ["get", "update"],
        },
    ]
    (binding,) = [b for b in of_kind(docs, "RoleBinding") if b["metadata"]["name"] == lease]
    assert binding["roleRef"]["name"] == lease
    assert binding["subjects"][0]["name"] == deployment["spec"]["template"]["spec"]["serviceAccountName"]
    # The leader Role stays in the release namespace whatever the scope.
    wide = render(helm, "clusterWide=true")
    assert [r["metadata"]["namespace"] for r in of_kind(wide, "Role")] == ["skiff-system"]


def test_operator_settings_reach_the_command_line(helm: Helm) -> None:
    args = container(
        render(helm, 'operator.logLevel="DEBUG"', "operator.resyncSeconds=15", "operator.routeSettleSeconds=0.5")
    )["args"]
    assert args[:2] == ["run", "--standalone"]
    assert "--log-level=DEBUG" in args
    assert "--resync-seconds=15" in args
    assert "--route-settle-seconds=0.5" in args
    assert "--route-settle-seconds=3" in container(render(helm))["args"]


def runtime_monitor(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The runtime pods' ServiceMonitor (the other one scrapes the operator)."""
    (monitor,) = [d for d in of_kind(docs, "ServiceMonitor") if d["metadata"]["name"].endswith("-runtime")]
    return monitor


def test_service_monitor_is_off_by_default_and_scrapes_version_services_when_on(helm: Helm) -> None:
    assert of_kind(render(helm), "ServiceMonitor") == []
    monitor = runtime_monitor(render(helm, "serviceMonitor.enabled=true", 'serviceMonitor.labels={"release":"prom"}'))
    assert monitor["metadata"]["labels"]["release"] == "prom"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert {k: endpoint[k] for k in ("port", "interval")} == {"port": "metrics", "interval": "30s"}
    # the pod's model and version become every series' `model` and `version` (the dashboard filters on them)
    assert endpoint["relabelings"] == [
        {"sourceLabels": ["__meta_kubernetes_pod_label_skiff_dev_model"], "targetLabel": "model"},
        {"sourceLabels": ["__meta_kubernetes_pod_label_skiff_dev_version"], "targetLabel": "version"},
    ]
    # The release namespace by default (the namespaces served), every namespace only when cluster-wide.
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["skiff-system"]}
    assert monitor["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "skiff-runtime",
        "app.kubernetes.io/managed-by": "skiff-operator",
    }
    assert monitor["spec"]["selector"]["matchExpressions"] == [{"key": "skiff.dev/version", "operator": "Exists"}]
    scoped = runtime_monitor(render(helm, "serviceMonitor.enabled=true", 'watchNamespaces=["ml"]'))
    assert scoped["spec"]["namespaceSelector"] == {"matchNames": ["ml"]}
    everywhere = runtime_monitor(render(helm, "serviceMonitor.enabled=true", "clusterWide=true"))
    assert everywhere["spec"]["namespaceSelector"] == {"any": True}


def test_service_monitor_port_is_the_one_the_operator_renders() -> None:
    from skiff_operator import contract
    from skiff_operator.render.service import _PORTS

    assert {k: v for k, v in next(p for p in _PORTS if p["name"] == "metrics").items() if k in ("name", "port")} == {
        "name": "metrics",
        "port": contract.METRICS_PORT,
    }
    assert contract.METRICS_PORT == 8003


def test_crd_is_a_copy_of_crds_kept_on_uninstall_and_optional(helm: Helm) -> None:
    crd = one(render(helm), "CustomResourceDefinition")
    assert crd["metadata"].pop("annotations") == {KEEP: "keep"}
    assert crd == yaml.safe_load(CRD_SOURCE.read_text())
    assert of_kind(render(helm, "crds.install=false"), "CustomResourceDefinition") == []


def test_cluster_scoped_names_carry_the_release_namespace(helm: Helm) -> None:
    """Two releases of the same name in two namespaces (one operator per team) must not fight over one
    ClusterRole."""
    a = one(render(helm, namespace="team-a"), "ClusterRole")["metadata"]["name"]
    b = one(render(helm, namespace="team-b"), "ClusterRole")["metadata"]["name"]
    assert a != b


@pytest.mark.parametrize("name", ["crd.yaml", "install.yaml"])
def test_generated_files_are_current(helm: Helm, name: str) -> None:
    """charts/skiff/templates/crd.yaml (from crds/) and manifests/install.yaml (the chart rendered): run
    `make manifests` after changing either source."""
    for path, text in generated_files(helm).items():
        if path.name == name:
            assert path.read_text() == text, f"{path} is out of date: run `make manifests`"
            return
    raise AssertionError(name)


def test_install_bundle_is_the_namespace_then_the_default_chart() -> None:
    from devtools.helm import INSTALL_BUNDLE

    docs = [d for d in yaml.safe_load_all(INSTALL_BUNDLE.read_text()) if d]
    assert docs[0]["kind"] == "Namespace"
    assert docs[0]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert {d["kind"] for d in docs[1:]} == {
        "ServiceAccount",
        "CustomResourceDefinition",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "FlowSchema",
        "PriorityLevelConfiguration",
        "Deployment",
        "Service",  # the operator's metrics port
    }
    assert all(d["metadata"].get("namespace", "skiff-system") == "skiff-system" for d in docs[1:])


def test_operator_requests_get_their_own_priority_level_below_users(helm: Helm) -> None:
    """API Priority and Fairness: the operator's ServiceAccount (and only it) is matched before the built-in
    "service-accounts" schema (9000); its Lease renewals stay on leader-election, the rest goes to a level with
    fewer shares than workload-low (100), one flow per namespace."""
    docs = render(helm)
    level = one(docs, "PriorityLevelConfiguration")
    assert level["spec"]["limited"]["nominalConcurrencyShares"] < 100
    schemas = {d["metadata"]["name"]: d["spec"] for d in of_kind(docs, "FlowSchema")}
    leases, everything = schemas["skiff-skiff-system-leases"], schemas["skiff-skiff-system"]
    assert leases["priorityLevelConfiguration"]["name"] == "leader-election"
    assert everything["priorityLevelConfiguration"]["name"] == level["metadata"]["name"]
    assert leases["matchingPrecedence"] < everything["matchingPrecedence"] < 9000
    assert everything["distinguisherMethod"]["type"] == "ByNamespace"
    subjects = [s for spec in schemas.values() for rule in spec["rules"] for s in rule["subjects"]]
    account = one(docs, "ServiceAccount")["metadata"]
    subject = {"kind": "ServiceAccount", "serviceAccount": {"name": account["name"], "namespace": account["namespace"]}}
    assert subjects == [subject, subject]
    assert not of_kind(render(helm, "apiPriority.enabled=false"), "FlowSchema")


def test_priority_precedence_must_match_before_service_accounts(helm: Helm) -> None:
    with pytest.raises(HelmError) as error:
        helm.template("apiPriority.matchingPrecedence=9000")
    assert "apiPriority/matchingPrecedence" in error.value.stderr
    helm.template("apiPriority.matchingPrecedence=8999")


def test_the_policy_checks_only_the_claims_a_model_mounts_whatever_its_versions_serve() -> None:
    """The admission policy's `claims` variable (what the user must be able to `get`) on a model whose versions
    mount a claim, fetch from S3 and read the image's own OCR weights (packaged://): only the claim is checked. A
    task (versions[].task) names paths inside its version's own model directory, so it needs no rule of its own."""
    import celpy
    from celpy import celtypes

    def split(text: celtypes.StringType, separator: celtypes.StringType) -> celtypes.ListType:
        """Kubernetes' CEL strings library `split()`, which cel-python lacks ..."""
        return celtypes.ListType([celtypes.StringType(part) for part in str(text).split(str(separator))])

    def substring(text: celtypes.StringType, start: celtypes.IntType) -> celtypes.StringType:
        """... and its `substring()`."""
        return celtypes.StringType(str(text)[int(start) :])

    template = (CHART / "templates" / "admissionpolicy.yaml").read_text()
    match = re.search(r'- name: claims\n\s+expression: "(.+)"\n', template)
    assert match is not None
    environment = celpy.Environment()
    functions = {"split": split, "substring": substring}
    program = environment.program(environment.compile(match.group(1)), functions=functions)
    versions = [
        {"name": "v1", "modelUri": "pvc://models/ocr/v4", "task": {"name": "ocr"}},
        {"name": "v2", "modelUri": "s3://models/ocr/v4", "task": {"name": "ocr"}},
        {"name": "v3", "modelUri": "packaged://pp-ocrv4", "task": {"name": "ocr"}},
    ]
    claims = program.evaluate({"object": celpy.json_to_cel({"spec": {"versions": versions}})})
    assert [str(claim) for claim in claims] == ["models", "", ""]
