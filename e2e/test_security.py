"""A shared cluster against a real API server, with a tenant who may only create InferenceModels in one
namespace: the operator never takes over an object it does not control for the tenant (NameConflict, the victim
unchanged), never mounts a service-account token, renders a NetworkPolicy the API server accepts; the chart's
ValidatingAdmissionPolicy refuses the tenant's model when it names a Secret or claim the tenant cannot read, a
disallowed image, PriorityClass, RuntimeClass or toleration; and the chart's RBAC is minimal: with one verb
removed, a named check fails. docs/security.md maps each "the tenant cannot" to its test.

No network plugin runs on kwok's simulated nodes, so NetworkPolicies are checked as objects (accepted, with the
expected selectors), not enforced; docs/security.md says so.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from devtools.cluster import Kubectl, eventually
from devtools.helm import Helm, documents
from devtools.local_pod import local_pod, start_local_pod, stop_local_pod, wait_for_startup_probe
from devtools.models import load_example
from devtools.traffic import write_sample_model

from e2e.harness import (
    RELEASE,
    ChartOperator,
    OperatorProcess,
    chart_deployment,
    condition,
    forbidden_lines,
    install_chart,
    secret_data,
    service_account_kubeconfig,
)
from skiff_runtime.client import SkiffClient

TENANT = "tenant"
READY_JSONPATH = '{.status.conditions[?(@.type=="Ready")].reason}'


def wait_reason(kube: Kubectl, namespace: str, name: str, reason: str) -> dict[str, Any]:
    kube.run(
        "wait", f"--for=jsonpath={READY_JSONPATH}={reason}", f"inferencemodel/{name}", "-n", namespace, "--timeout=90s"
    )
    model: dict[str, Any] = kube.get("inferencemodel", name, "-n", namespace)
    return model


def model_events(kube: Kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.kind=InferenceModel,involvedObject.name={name}"
    return list(kube.get("events", "-n", namespace, "--field-selector", selector)["items"])


def comparable(manifest: dict[str, Any]) -> dict[str, Any]:
    """What a takeover would change: labels, owners, spec and data (not the server's bookkeeping)."""
    metadata = manifest["metadata"]
    kept = {key: metadata.get(key) for key in ("labels", "ownerReferences", "uid", "resourceVersion")}
    return {"metadata": kept, **{k: manifest.get(k) for k in ("spec", "data", "type")}}


# -- ownership before apply ---------------------------------------------------------------------------------


def test_an_existing_service_and_secret_are_never_taken_over(
    kube: Kubectl, namespace: str, claims: list[str], operator: OperatorProcess, tenant: Kubectl
) -> None:
    """The tenant, who cannot write Services or Secrets, names its model after them: the operator (which can)
    refuses to write them for it."""
    model = load_example("tls", namespace)
    name = model["metadata"]["name"]
    victims: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": "victim"}},
            "spec": {"selector": {"app": "victim"}, "ports": [{"port": 443}]},
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": f"{name}-tls-ca", "namespace": namespace},
            "stringData": {"password": "hunter2"},
        },
    ]
    kube.apply(victims)
    before = [comparable(kube.get(v["kind"].lower(), v["metadata"]["name"], "-n", namespace)) for v in victims]

    tenant.apply(model)
    stored = wait_reason(kube, namespace, name, "NameConflict")
    message = condition(stored, "Ready")["message"]
    assert f"Secret/{name}-tls-ca exists and it has no controller" in message
    assert "hunter2" not in json.dumps(stored)
    eventually(
        lambda: [
            e for e in model_events(kube, namespace, name) if (e["type"], e["reason"]) == ("Warning", "NameConflict")
        ],
        timeout=30,
        what="a NameConflict Event on the model",
    )
    # Fix the Secret's name clash: the next reconcile meets the Service's.
    kube.run("delete", "secret", f"{name}-tls-ca", "-n", namespace)
    eventually(
        lambda: (
            f"Service/{name} exists" in condition(kube.get("inferencemodel", name, "-n", namespace), "Ready")["message"]
        ),
        timeout=60,
        what="NameConflict naming the Service",
    )
    assert comparable(kube.get("service", name, "-n", namespace)) == before[0]
    assert kube.items("deployment", namespace, f"skiff.dev/model={name}") == []  # nothing of the model applied
    # Not even the TLS step's Secrets: the Service's conflict stops the pass before anything is written.
    secrets = {s["metadata"]["name"] for s in kube.items("secret", namespace)}
    assert not secrets & {f"{name}-tls-ca", f"{name}-tls"}, secrets

    # Deleting the model leaves the victim: it was never the model's child.
    kube.run("delete", "inferencemodel", name, "-n", namespace, "--wait=true", "--timeout=60s")
    assert comparable(kube.get("service", name, "-n", namespace)) == before[0]


@pytest.mark.usefixtures("gateway_api")
def test_an_existing_grpc_route_is_never_taken_over(
    kube: Kubectl, namespace: str, claims: list[str], operator: OperatorProcess, tenant: Kubectl
) -> None:
    model = load_example("cpu", namespace)
    name = model["metadata"]["name"]
    model["spec"]["routing"] = {"mode": "Gateway", "gateways": [{"name": "edge"}]}
    victim = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "GRPCRoute",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"parentRefs": [{"name": "theirs"}], "rules": [{"backendRefs": [{"name": "theirs", "port": 1}]}]},
    }
    kube.apply(victim)
    before = comparable(kube.get("grpcroute", name, "-n", namespace))
    tenant.apply(model)
    stored = wait_reason(kube, namespace, name, "NameConflict")
    assert f"GRPCRoute/{name} exists and it has no controller" in condition(stored, "Ready")["message"]
    assert comparable(kube.get("grpcroute", name, "-n", namespace)) == before


def test_two_models_rendering_one_name_the_second_is_refused(
    kube: Kubectl, namespace: str, claims: list[str], operator: OperatorProcess
) -> None:
    first = load_example("cpu", namespace)
    first["metadata"]["name"] = "a"
    first["spec"]["versions"][0]["name"] = "b-c"
    second = copy.deepcopy(first)
    second["metadata"]["name"] = "a-b"
    second["spec"]["versions"][0]["name"] = "c"
    kube.apply(first)
    kube.run("wait", "--for=condition=Ready", "inferencemodel/a", "-n", namespace, "--timeout=120s")
    deployment = kube.get("deployment", "a-b-c", "-n", namespace)

    kube.apply(second)
    stored = wait_reason(kube, namespace, "a-b", "NameConflict")
    assert "Deployment/a-b-c exists and it is controlled by InferenceModel a" in condition(stored, "Ready")["message"]
    after = kube.get("deployment", "a-b-c", "-n", namespace)
    assert comparable(after) == comparable(deployment)
    assert condition(kube.get("inferencemodel", "a", "-n", namespace), "Ready")["status"] == "True"


def test_a_service_account_token_secret_is_never_mounted(
    kube: Kubectl, namespace: str, claims: list[str], operator: OperatorProcess, tenant: Kubectl
) -> None:
    """Even a tenant allowed to read a token Secret (the admission policy stops the others) cannot have it
    mounted: the operator refuses it."""
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/service-account-token",
            "metadata": {
                "name": "default-token",
                "namespace": namespace,
                "annotations": {"kubernetes.io/service-account.name": "default"},
            },
        }
    )
    eventually(
        lambda: (kube.get("secret", "default-token", "-n", namespace).get("data") or {}).get("ca.crt"),
        timeout=60,
        what="the token controller to fill the token Secret (it has a ca.crt)",
    )
    model = load_example("tls", namespace)
    model["spec"]["tls"]["clientCASecretName"] = "default-token"
    tenant.apply(model)
    stored = wait_reason(kube, namespace, model["metadata"]["name"], "SecretRefused")
    assert "never mounts service-account tokens" in condition(stored, "Ready")["message"]
    assert kube.items("deployment", namespace, f"skiff.dev/model={model['metadata']['name']}") == []


# -- NetworkPolicy --------------------------------------------------------------------------------------------


def test_network_policy_is_accepted_with_the_expected_selectors_and_removed_on_opt_out(
    kube: Kubectl, namespace: str, claims: list[str], operator: OperatorProcess
) -> None:
    model = load_example("cpu", namespace)
    name = model["metadata"]["name"]
    model["spec"]["networkPolicy"] = {
        "inferenceFrom": [{"namespaceSelector": {"matchLabels": {"team": "fraud"}}}],
        "metricsNamespaces": ["monitoring"],
    }
    kube.apply(model)
    kube.run("wait", "--for=condition=Ready", f"inferencemodel/{name}", "-n", namespace, "--timeout=120s")
    policy = kube.get("networkpolicy", name, "-n", namespace)
    assert policy["metadata"]["ownerReferences"][0]["kind"] == "InferenceModel"
    assert policy["spec"]["podSelector"] == {"matchLabels": {"skiff.dev/model": name}}
    # The policy selects the model's pods, as the API server evaluates the selector.
    selected = kube.items("pod", namespace, f"skiff.dev/model={name}")
    assert len(selected) == model["spec"]["versions"][0]["replicas"]
    ingress = {rule["ports"][0]["port"]: rule for rule in policy["spec"]["ingress"]}
    assert ingress[8001]["from"] == [{"namespaceSelector": {"matchLabels": {"team": "fraud"}}}]
    # No pod is admitted to health (8002): kubelet probes come from the node, which no NetworkPolicy blocks.
    assert sorted(ingress) == [8001, 8003]
    assert all(port["port"] != 8002 for rule in policy["spec"]["ingress"] for port in rule["ports"])
    assert ingress[8003]["from"][0]["namespaceSelector"]["matchExpressions"][0]["values"] == ["monitoring"]

    kube.run(
        "patch",
        "inferencemodel",
        name,
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"networkPolicy":{"enabled":false}}}',
    )
    eventually(
        lambda: kube.get_or_none("networkpolicy", name, namespace) is None, timeout=60, what="the policy deleted"
    )


# -- spec.auth: the runtime from the operator's Deployment requires the token, and follows a rotated Secret -------


def test_runtime_from_an_auth_deployment_requires_the_token_and_follows_a_rotated_secret(
    kube: Kubectl, namespace: str, claims: list[str], operator: OperatorProcess, tmp_path: Path
) -> None:
    kube.run("create", "secret", "generic", "callers", "-n", namespace, "--from-literal=token=first-token")
    body = load_example("cpu", namespace)
    name = body["metadata"]["name"]
    body["spec"]["auth"] = {"tokenSecretName": "callers"}
    kube.apply(body)
    deployment = eventually(
        lambda: kube.get_or_none("deployment", f"{name}-v1", namespace), timeout=60, what="the Deployment"
    )
    claim_root = tmp_path / "pvc-models"
    claim, path = body["spec"]["versions"][0]["modelUri"].removeprefix("pvc://").split("/", 1)
    assert claim == "models"
    write_sample_model(claim_root / path)
    scratch = tmp_path / "pod"
    scratch.mkdir()
    secrets = {"callers": secret_data(kube, "callers", namespace)}
    pod = local_pod(deployment, claim_roots={"models": claim_root}, scratch=scratch, secrets=secrets)
    token_file = pod.mounts["/etc/skiff/auth"] / "token"
    assert pod.env["SKIFF_AUTH_TOKEN_FILE"] == str(token_file)
    assert sorted(p.name for p in token_file.parent.iterdir()) == ["token"]  # one key, not the Secret

    log = tmp_path / "runtime.log"
    process = start_local_pod(pod, scratch, log)
    try:
        wait_for_startup_probe(pod, process)  # health stays open: the kubelet sends no token
        target = f"127.0.0.1:{pod.port_of('grpc')}"

        def metadata_code(token: str | None) -> grpc.StatusCode:
            with SkiffClient(target, timeout_s=10, token=token) as client:
                try:
                    client.metadata(name)
                except grpc.RpcError as error:
                    return error.code()
            return grpc.StatusCode.OK

        assert metadata_code(None) is grpc.StatusCode.UNAUTHENTICATED
        assert metadata_code("first-token") is grpc.StatusCode.OK

        # Rotation with an overlap: the Secret changes in the API server, the kubelet rewrites the mounted file
        # (done here by hand: kwok runs no kubelet), and the same process takes the tokens it lists.
        def rotate(tokens: str) -> None:
            patch = json.dumps({"stringData": {"token": tokens}})
            kube.run("patch", "secret", "callers", "-n", namespace, "-p", patch)
            token_file.chmod(0o600)
            token_file.write_bytes(secret_data(kube, "callers", namespace)["token"])

        rotate("first-token\nsecond-token\n")  # add the new token; clients move to it
        assert metadata_code("first-token") is grpc.StatusCode.OK
        assert metadata_code("second-token") is grpc.StatusCode.OK
        rotate("second-token\n")  # then remove the old one
        assert metadata_code("second-token") is grpc.StatusCode.OK
        assert metadata_code("first-token") is grpc.StatusCode.UNAUTHENTICATED
        assert process.poll() is None
        template = kube.get("deployment", f"{name}-v1", "-n", namespace)["spec"]["template"]
        assert template == deployment["spec"]["template"]  # no rollout for a rotated token
    finally:
        stop_local_pod(process, log)


# -- the admission policy: what a tenant may make the operator do -----------------------------------------------


def admission_policy(helm_: Helm, namespace: str) -> list[dict[str, Any]]:
    """The chart's ValidatingAdmissionPolicy and binding, as `helm install` in `namespace` would create them."""
    rendered = helm_.template(release=RELEASE, namespace=namespace)
    return [d for d in documents(rendered) if d["kind"].startswith("ValidatingAdmissionPolicy")]


@pytest.fixture
def policy(kube: Kubectl, helm: Helm, namespace: str) -> Iterator[list[dict[str, Any]]]:
    """The policy and its binding for the test's namespace; deleted afterwards (they are cluster-scoped)."""
    objects = admission_policy(helm, namespace)
    kube.apply(objects)
    try:
        yield objects
    finally:
        for item in objects:
            kube.run("delete", item["kind"].lower(), item["metadata"]["name"], "--ignore-not-found")


@pytest.fixture
def tenant(kube: Kubectl, namespace: str, tmp_path: Path) -> Kubectl:
    """A ServiceAccount that may create InferenceModels in the namespace and read one Secret and one claim."""
    rules = [
        {"apiGroups": ["skiff.dev"], "resources": ["inferencemodels"], "verbs": ["get", "list", "create", "patch"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["readable"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "resourceNames": ["models"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["readable-ca"], "verbs": ["get"]},
    ]
    kube.apply(
        [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": TENANT, "namespace": namespace}},
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": TENANT, "namespace": namespace},
                "rules": rules,
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": TENANT, "namespace": namespace},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": TENANT},
                "subjects": [{"kind": "ServiceAccount", "name": TENANT, "namespace": namespace}],
            },
        ]
    )
    for secret in ("readable", "hidden"):
        kube.run("create", "secret", "generic", secret, "-n", namespace, "--from-literal=ca.crt=x")
    return Kubectl(service_account_kubeconfig(kube, namespace, TENANT, tmp_path / "tenant.kubeconfig"), kube.binary)


def tenant_model(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    body = load_example("cpu", namespace)
    body["metadata"]["name"] = name
    body["spec"].update(spec)
    return body


def create_as(user: Kubectl, body: dict[str, Any]) -> tuple[int, str]:
    done = user.attempt("create", "-f", "-", stdin=json.dumps(body))
    return done.returncode, done.stderr


def first_refusal(kube: Kubectl, user: Kubectl, body: dict[str, Any]) -> str:
    """The error of `user` creating `body`, once the API server has loaded the policy (a few seconds after it is
    created): until then an admitted model is deleted and the create tried again."""

    def attempt() -> str | None:
        code, stderr = create_as(user, body)
        if code == 0:
            kube.run("delete", "inferencemodel", body["metadata"]["name"], "-n", body["metadata"]["namespace"])
            return None
        return stderr

    return eventually(attempt, timeout=60, what=f"the admission policy to refuse {body['metadata']['name']}")


def test_tenant_is_refused_what_it_could_not_do_itself(
    kube: Kubectl, namespace: str, claims: list[str], policy: list[dict[str, Any]], tenant: Kubectl
) -> None:
    user = f"system:serviceaccount:{namespace}:{TENANT}"
    hidden = tenant_model(namespace, "hidden", tls={"mode": "SelfSigned", "clientCASecretName": "hidden"})
    refused = first_refusal(kube, tenant, hidden)
    assert f"you ({user}) cannot get Secret hidden in namespace {namespace}, so spec.tls.clientCASecretName" in refused

    cases = {
        "claim": (tenant_model(namespace, "claim", versions=[{"name": "v1", "modelUri": "pvc://fraud-models/x"}]),
                  "cannot get every PersistentVolumeClaim the model mounts (fraud-models)"),
        "image": (tenant_model(namespace, "image", runtime={"image": "evil.example/miner:1"}),
                  "image evil.example/miner:1 is not allowed"),
        "priority": (tenant_model(namespace, "priority", scheduling={"priorityClassName": "system-node-critical"}),
                     "scheduling.priorityClassName system-node-critical is not allowed"),
        "runtime-class": (tenant_model(namespace, "runtime-class", scheduling={"runtimeClassName": "unconfined"}),
                          "scheduling.runtimeClassName unconfined is not allowed"),
        "tolerate-all": (tenant_model(namespace, "tolerate-all", scheduling={"tolerations": [{"operator": "Exists"}]}),
                         "never every taint (an empty key)"),
        "control-plane": (
            tenant_model(namespace, "control-plane", scheduling={
                "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}),
            "may tolerate only the taint keys",
        ),
        "cache-claim": (
            tenant_model(namespace, "cache-claim", runtime={"tensorrt": {"cacheDir": {"claimName": "fraud-cache"}}}),
            "cannot get every PersistentVolumeClaim the model mounts (models, fraud-cache)",
        ),
        "pull-secret": (tenant_model(namespace, "pull-secret", runtime={"imagePullSecrets": ["readable", "hidden"]}),
                        "cannot get every Secret spec.runtime.imagePullSecrets names (readable, hidden)"),
        "gpu-resource": (
            tenant_model(namespace, "gpu-resource", resources={"gpu": 1, "gpuResourceName": "example.com/fpga"}),
            "gpuResourceName example.com/fpga is not allowed",
        ),
        "node-selector": (
            tenant_model(namespace, "node-selector", scheduling={"nodeSelector": {"kubernetes.io/hostname": "n"}}),
            "scheduling.nodeSelector may not select on kubernetes.io/hostname",
        ),
        "node-by-name": (
            tenant_model(namespace, "node-by-name", scheduling={"affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": ["gpu-node"]}]}]}}}}),
            "never on node fields",
        ),
        "other-namespace-pods": (
            tenant_model(namespace, "other-namespace-pods", scheduling={"affinity": {"podAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "podAffinityTerm": {
                    "topologyKey": "kubernetes.io/hostname", "namespaceSelector": {},
                    "labelSelector": {"matchLabels": {"app": "bank"}}}}]}}}),
            f"may match only pods of namespace {namespace}",
        ),
        "gateway": (
            tenant_model(namespace, "gateway", routing={"gateways": [{"name": "public", "namespace": "infra"}]}),
            "cannot create GRPCRoutes",
        ),
        "s3-secret": (
            tenant_model(namespace, "s3-secret", versions=[{"name": "v1", "modelUri": "s3://models/resnet/v1"}],
                         storage={"s3": {"secretName": "hidden"}}),
            f"cannot get Secret hidden in namespace {namespace}, so spec.storage.s3.secretName may not name it",
        ),
        "storage-ca": (
            tenant_model(namespace, "storage-ca", versions=[{"name": "v1", "modelUri": "https://m.example/r.tgz"}],
                         storage={"caConfigMapName": "hidden-ca"}),
            f"cannot get ConfigMap hidden-ca in namespace {namespace}, so spec.storage.caConfigMapName",
        ),
        "issuer": (
            tenant_model(namespace, "issuer", tls={
                "mode": "CertManager", "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}),
            "cannot create cert-manager Certificates",
        ),
    }  # fmt: skip
    for case, (body, expected) in cases.items():
        code, stderr = create_as(tenant, body)
        assert code != 0, f"{case}: the tenant's model was admitted"
        assert expected in stderr, f"{case}: {stderr}"

    # What the tenant may read, it may mount; an allowed model is admitted.
    allowed = tenant_model(namespace, "allowed", tls={"mode": "SelfSigned", "clientCASecretName": "readable"})
    assert create_as(tenant, allowed) == (0, "")
    # The allowed variant of each refusal above, in one model: a readable cache claim and pull Secret, an allowed
    # GPU resource, node label and toleration, pod anti-affinity within the namespace.
    placed = tenant_model(
        namespace,
        "placed",
        runtime={"imagePullSecrets": ["readable"], "tensorrt": {"cacheDir": {"claimName": "models"}}},
        resources={"gpu": 1, "gpuResourceName": "nvidia.com/mig-1g.10gb"},
        scheduling={
            "nodeSelector": {"nvidia.com/gpu.present": "true"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [
                        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]}]}},
                "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                    "topologyKey": "kubernetes.io/hostname", "namespaces": [namespace],
                    "labelSelector": {"matchLabels": {"skiff.dev/model": "placed"}}}]},
            },
        },
    )  # fmt: skip
    assert create_as(tenant, placed) == (0, "")
    # A fetched model whose credentials Secret and CA ConfigMap the tenant may read is admitted.
    fetched = tenant_model(
        namespace, "fetched", versions=[{"name": "v1", "modelUri": "s3://models/resnet/v1"}],
        storage={"s3": {"endpoint": "http://seaweedfs.storage:8333", "secretName": "readable"},
                 "caConfigMapName": "readable-ca"},
    )  # fmt: skip
    assert create_as(tenant, fetched) == (0, "")
    # A spec change is checked like a create: pointing the admitted model at the hidden Secret is refused.
    patch = json.dumps({"spec": {"tls": {"clientCASecretName": "hidden"}}})
    edited = tenant.attempt("patch", "inferencemodel", "allowed", "-n", namespace, "--type=merge", "-p", patch)
    assert edited.returncode != 0
    assert "cannot get Secret hidden" in edited.stderr
    # The tenant's own RBAC keeps it out of other namespaces.
    elsewhere = tenant_model("default", "elsewhere")
    code, stderr = create_as(tenant, elsewhere)
    assert code != 0
    assert "forbidden" in stderr.lower()
    # An admin (who can read every Secret, create routes and certificates) passes the checks the tenant failed.
    assert create_as(kube, hidden)[0] == 0
    for case in ("gateway", "issuer"):
        assert create_as(kube, cases[case][0]) == (0, ""), case

    # A tenant that may create GRPCRoutes but not HTTPRoutes: a gRPC-only gateway entry is admitted, one that also
    # names a restSectionName (an HTTPRoute to the REST port) is refused.
    kube.apply([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": f"{TENANT}-grpcroutes", "namespace": namespace},
         "rules": [{"apiGroups": ["gateway.networking.k8s.io"], "resources": ["grpcroutes"], "verbs": ["create"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": f"{TENANT}-grpcroutes", "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{TENANT}-grpcroutes"},
         "subjects": [{"kind": "ServiceAccount", "name": TENANT, "namespace": namespace}]},
    ])  # fmt: skip
    grpc_only = tenant_model(namespace, "grpc-only", routing={"gateways": [{"name": "public", "namespace": "infra"}]})
    eventually(lambda: create_as(tenant, grpc_only) == (0, "") or None, timeout=60, what="the GRPCRoute grant")
    rest = tenant_model(
        namespace, "rest-gateway", runtime={"rest": True},
        routing={"gateways": [{"name": "public", "namespace": "infra", "restSectionName": "http"}]},
    )  # fmt: skip
    code, stderr = create_as(tenant, rest)
    assert code != 0, "a REST gateway entry was admitted without create on httproutes"
    assert f"you ({user}) cannot create HTTPRoutes in namespace {namespace}" in stderr, stderr
    assert create_as(kube, rest) == (0, "")


def test_tenant_pod_template_names_only_what_it_could_use_itself(
    kube: Kubectl, namespace: str, claims: list[str], policy: list[dict[str, Any]], tenant: Kubectl
) -> None:
    """spec.podTemplate: each refusal beside the variant the same tenant is allowed."""
    user = f"system:serviceaccount:{namespace}:{TENANT}"

    def shaped(name: str, **pod_template: Any) -> dict[str, Any]:
        return tenant_model(namespace, name, podTemplate=pod_template)

    secret_env = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hidden", "key": "ca.crt"}}}]
    refused = first_refusal(kube, tenant, shaped("secret-env", env=secret_env))
    assert (
        f"you ({user}) cannot get every Secret spec.podTemplate.env[].valueFrom.secretKeyRef names (hidden) in"
        in refused
    )
    sidecar = {"name": "agent", "image": "vault:1.17"}
    cases = {
        "secret-volume": (shaped("secret-volume", volumes=[{"name": "s", "secret": {"secretName": "hidden"}}]),
                          "cannot get every Secret spec.podTemplate.volumes names (hidden) in"),
        "projected-secret": (shaped("projected-secret", volumes=[{"name": "p", "projected": {"sources": [
                                 {"secret": {"name": "hidden"}}]}}]),
                             "cannot get every Secret spec.podTemplate.volumes[].projected names"),
        "sidecar-env-from": (shaped("sidecar-env-from", sidecars=[{**sidecar, "envFrom": [
                                 {"secretRef": {"name": "hidden"}}]}]),
                             "cannot get every Secret spec.podTemplate.sidecars[].env and envFrom names"),
        "config-map": (shaped("config-map", envFrom=[{"configMapRef": {"name": "hidden-ca"}}]),
                       "cannot get every ConfigMap spec.podTemplate.envFrom[].configMapRef names (hidden-ca) in"),
        "claim": (shaped("claim", volumes=[{"name": "c", "persistentVolumeClaim": {"claimName": "fraud-models"}}]),
                  "cannot get every PersistentVolumeClaim the model mounts (models, fraud-models)"),
        "service-account": (shaped("service-account", serviceAccountName="default"),
                            f"cannot create pods in namespace {namespace}, so spec.podTemplate may not set"),
        "sidecar": (shaped("sidecar", sidecars=[sidecar]), "cannot create pods"),
        "spread": (shaped("spread", topologySpreadConstraints=[{"maxSkew": 1, "topologyKey": "example.com/rack",
                                                                "whenUnsatisfiable": "ScheduleAnyway"}]),
                   "may spread over kubernetes.io/hostname and the node label keys"),
    }  # fmt: skip
    for case, (body, expected) in cases.items():
        code, stderr = create_as(tenant, body)
        assert code != 0, f"{case}: the tenant's model was admitted"
        assert expected in stderr, f"{case}: {stderr}"

    # The allowed variants: what the tenant may read it may mount and read into env; spread over nodes and zones.
    readable = shaped(
        "readable",
        env=[{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "readable", "key": "ca.crt"}}}],
        envFrom=[{"configMapRef": {"name": "readable-ca"}}],
        volumes=[{"name": "s", "secret": {"secretName": "readable"}},
                 {"name": "p", "projected": {"sources": [{"secret": {"name": "readable"}}]}},
                 {"name": "c", "persistentVolumeClaim": {"claimName": "models"}}],
        topologySpreadConstraints=[{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                    "whenUnsatisfiable": "ScheduleAnyway"},
                                   {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                    "whenUnsatisfiable": "ScheduleAnyway"}],
        labels={"team": "fraud"},
        annotations={"sidecar.istio.io/inject": "true"},
    )  # fmt: skip
    assert create_as(tenant, readable) == (0, "")
    # One who may create pods may pick the ServiceAccount and add a sidecar, as a pod of their own would.
    kube.apply(
        [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": "pod-creator", "namespace": namespace},
             "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "pod-creator", "namespace": namespace},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-creator"},
             "subjects": [{"kind": "ServiceAccount", "name": TENANT, "namespace": namespace}]},
        ]
    )  # fmt: skip

    def admitted() -> bool | None:
        return (
            create_as(tenant, shaped("identity", serviceAccountName="default", sidecars=[sidecar])) == (0, "") or None
        )

    eventually(admitted, timeout=30, what="a pod creator's model with a ServiceAccount and a sidecar to be admitted")


# -- the chart's RBAC is minimal: a removed verb fails a named check -------------------------------------------


NEGATIVE_CONTROLS = {
    # (resource, verb removed): what breaks, as it shows in the operator's log or the model's status
    ("secrets", "get"): "secrets",  # the TLS step reads its Secrets by name
    ("secrets", "patch"): "secrets",  # ... and applies them
    ("deployments", "patch"): "deployments",
    ("services", "patch"): "services",
    ("networkpolicies", "list"): "networkpolicies",
    ("poddisruptionbudgets", "list"): "poddisruptionbudgets",
    ("pods", "watch"): "pods",
}


@pytest.mark.parametrize(("resource", "verb"), list(NEGATIVE_CONTROLS), ids=lambda x: str(x))
def test_a_verb_removed_from_the_chart_role_is_forbidden(
    kube: Kubectl,
    helm: Helm,
    namespace: str,
    claims: list[str],
    simulated_nodes: None,
    tmp_path: Path,
    resource: str,
    verb: str,
) -> None:
    install_chart(helm, namespace, "crds.install=false", "operator.resyncSeconds=10", "admissionPolicy.enabled=false")
    role = kube.get("role", RELEASE, "-n", namespace)
    for rule in role["rules"]:
        if resource in rule["resources"]:
            assert verb in rule["verbs"], f"the chart grants no {verb} on {resource}: the control would prove nothing"
            rule["verbs"] = [v for v in rule["verbs"] if v != verb]
    kube.run("replace", "-f", "-", stdin=json.dumps(role))
    kubeconfig = service_account_kubeconfig(kube, namespace, RELEASE, tmp_path / "sa.kubeconfig")

    model = load_example("tls", namespace)
    with ChartOperator(chart_deployment(kube, namespace), kubeconfig, tmp_path / "operator.log") as operator:
        kube.apply(model)
        lines = eventually(
            lambda: [line for line in forbidden_lines(operator.log(), kube, model) if resource in line],
            timeout=60,
            what=f"Forbidden on {resource} in the operator's log or the model's status",
        )
        assert lines
