"""A real Prometheus for the e2e tests (built from its Go module by devtools/prometheus-go/build.sh): the scrape
job the Prometheus Operator would make of the chart's ServiceMonitor, a ServiceAccount with the read access that job
needs, the server on 127.0.0.1 with a free port, and its HTTP query API.

`scrape_jobs` is pure and follows the Prometheus Operator's generator (pkg/prometheus/promcfg.go): the Service's
selector labels and the endpoint's port as `keep` rules over `kubernetes_sd_configs` role `endpoints`, the target
labels `namespace`, `service`, `pod`, `container`, `endpoint` and `job`, then the ServiceMonitor's own relabelings.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devtools.cluster import REPO, Kubectl, free_port, start_http_service, terminate

BUILD_SCRIPT = REPO / "devtools" / "prometheus-go" / "build.sh"
# Debian's `prometheus` (2.42) lacks Kubernetes discovery ("field kubernetes_sd_configs not found"): built instead.
INSTALL_HINT = "make controlplane  (runs devtools/prometheus-go/build.sh: about 4 min once on 2 cores, then cached)"
# What a Prometheus needs to discover ServiceMonitor targets (role `endpoints`) in one namespace: docs/observability.md.
DISCOVERY_RULES = [
    {"apiGroups": [""], "resources": ["services", "endpoints", "pods"], "verbs": ["get", "list", "watch"]}
]
# A label selector's expression operators -> the relabel action over "the label is present" (In/NotIn: and its value).
EXPRESSION_ACTIONS = {"Exists": "keep", "DoesNotExist": "drop", "In": "keep", "NotIn": "drop"}
# ServiceMonitor relabeling fields (camelCase) -> Prometheus relabel_config fields.
RELABEL_FIELDS = {
    "sourceLabels": "source_labels",
    "separator": "separator",
    "targetLabel": "target_label",
    "regex": "regex",
    "modulus": "modulus",
    "replacement": "replacement",
    "action": "action",
}


def prometheus_binary() -> str | None:
    """$SKIFF_PROMETHEUS, else the one build.sh made; None when it is not built yet."""
    if os.environ.get("SKIFF_PROMETHEUS"):
        return os.environ["SKIFF_PROMETHEUS"]
    done = subprocess.run(["bash", str(BUILD_SCRIPT), "--path"], capture_output=True, text=True, check=True)
    path = Path(done.stdout.strip())
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


def meta_label(kind: str, label: str, present: bool = False) -> str:
    """The discovery meta label of a Kubernetes label: `app.kubernetes.io/name` on a Service ->
    `__meta_kubernetes_service_label_app_kubernetes_io_name` (`..._labelpresent_...` with `present`)."""
    return f"__meta_kubernetes_{kind}_label{'present' if present else ''}_{re.sub(r'[^a-zA-Z0-9_]', '_', label)}"


def keep(source: str, regex: str) -> dict[str, Any]:
    return {"action": "keep", "source_labels": [source], "regex": regex}


def _relabeling(rule: Mapping[str, Any]) -> dict[str, Any]:
    unknown = set(rule) - set(RELABEL_FIELDS)
    if unknown:
        raise ValueError(f"ServiceMonitor relabeling fields {sorted(unknown)} are not translated; add them here")
    return {RELABEL_FIELDS[key]: value for key, value in rule.items()}


def selector_rules(selector: Mapping[str, Any]) -> list[dict[str, Any]]:
    """`keep` rules selecting the Services a label selector selects (matchLabels; matchExpressions In, NotIn,
    Exists, DoesNotExist), as the Prometheus Operator writes them."""
    rules = []
    for label, value in sorted(selector.get("matchLabels", {}).items()):
        sources = [meta_label("service", label), meta_label("service", label, present=True)]
        rules.append({"action": "keep", "source_labels": sources, "regex": f"({re.escape(value)});true"})
    for expression in selector.get("matchExpressions", []):
        label, operator = expression["key"], expression["operator"]
        if operator not in EXPRESSION_ACTIONS:
            raise ValueError(f"selector operator {operator!r} is not one of {sorted(EXPRESSION_ACTIONS)}")
        present = meta_label("service", label, present=True)
        rule: dict[str, Any] = {"action": EXPRESSION_ACTIONS[operator], "source_labels": [present], "regex": "true"}
        if operator in ("In", "NotIn"):  # the value, on a Service that has the label
            values = "|".join(re.escape(v) for v in expression.get("values", []))
            rule.update(source_labels=[meta_label("service", label), present], regex=f"({values});true")
        rules.append(rule)
    return rules


def target_labels(port: str) -> list[dict[str, Any]]:
    """The labels the Prometheus Operator sets on every target of a ServiceMonitor endpoint."""
    copied = {
        "namespace": "__meta_kubernetes_namespace",
        "service": "__meta_kubernetes_service_name",
        "pod": "__meta_kubernetes_pod_name",
        "container": "__meta_kubernetes_pod_container_name",
        "job": "__meta_kubernetes_service_name",
    }
    rules = [{"source_labels": [source], "target_label": target} for target, source in copied.items()]
    return [*rules, {"target_label": "endpoint", "replacement": port}]


def scrape_jobs(monitor: Mapping[str, Any], namespaces: Sequence[str], kubeconfig: Path) -> list[dict[str, Any]]:
    """One Prometheus scrape job per endpoint of the ServiceMonitor, discovering through `kubeconfig` in
    `namespaces` (what its namespaceSelector resolves to; a Prometheus Operator lists them the same way)."""
    spec = monitor["spec"]
    selector = selector_rules(spec["selector"])
    jobs = []
    for number, endpoint in enumerate(spec["endpoints"]):
        if "port" not in endpoint:
            raise ValueError("only ServiceMonitor endpoints that name a port are translated")
        port = endpoint["port"]
        name = monitor["metadata"]["name"]
        job: dict[str, Any] = {
            "job_name": f"serviceMonitor/{monitor['metadata'].get('namespace', 'default')}/{name}/{number}",
            "honor_labels": bool(endpoint.get("honorLabels", False)),
            "metrics_path": endpoint.get("path", "/metrics"),
            "scheme": endpoint.get("scheme", "http"),
            "kubernetes_sd_configs": [
                {"role": "endpoints", "kubeconfig_file": str(kubeconfig), "namespaces": {"names": list(namespaces)}}
            ],
            "relabel_configs": [
                *selector,
                keep("__meta_kubernetes_endpoint_port_name", re.escape(port)),
                *target_labels(port),
                *(_relabeling(rule) for rule in endpoint.get("relabelings", [])),
            ],
        }
        if "interval" in endpoint:
            job["scrape_interval"] = endpoint["interval"]
            job["scrape_timeout"] = endpoint.get("scrapeTimeout", endpoint["interval"])
        jobs.append(job)
    return jobs


def service_account_kubeconfig(kube: Kubectl, namespace: str, name: str, rules: list[dict[str, Any]]) -> str:
    """A ServiceAccount `name` in `namespace` bound to a Role of `rules` there, and a kubeconfig that signs in as
    it (a one-hour token) to the cluster `kube` reaches."""
    meta = {"name": name, "namespace": namespace}
    kube.apply(
        [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": rules},
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": meta,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
            },
        ]
    )
    token = kube.run("create", "token", name, "-n", namespace, "--duration=1h").strip()
    current = yaml.safe_load(kube.kubeconfig.read_text())
    context = next(c for c in current["contexts"] if c["name"] == current["current-context"])["context"]
    cluster = next(c for c in current["clusters"] if c["name"] == context["cluster"])["cluster"]
    if "certificate-authority" in cluster:  # a path relative to the kubeconfig's folder, or absolute
        cluster = {**cluster, "certificate-authority": str(kube.kubeconfig.parent / cluster["certificate-authority"])}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": cluster}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": "cluster", "user": name, "namespace": namespace}}],
        "current-context": name,
    }
    return yaml.safe_dump(config)


class PrometheusError(RuntimeError):
    """The Prometheus API answered an error, or did not answer."""


@dataclass
class Prometheus:
    """`prometheus` on 127.0.0.1 with a free port, its data and log in `workdir`; stop() ends it."""

    workdir: Path
    binary: str
    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "prometheus.log"

    def start(self, jobs: Sequence[Mapping[str, Any]], *, evaluation_interval: str = "5s") -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(
            yaml.safe_dump({"global": {"evaluation_interval": evaluation_interval}, "scrape_configs": list(jobs)})
        )
        self.port = free_port()
        self.process = start_http_service(
            [
                self.binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
            ],
            self.log_path,
            f"{self.url}/-/ready",
            "prometheus",
            PrometheusError,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process is not None:
            terminate(self.process)
            self.process = None

    def api(self, path: str, **params: str | Sequence[str]) -> Any:
        """The `data` of a GET on /api/v1/<path>; PrometheusError with Prometheus' own error otherwise."""
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as response:
                body = json.load(response)
        except urllib.error.HTTPError as error:
            body = json.load(error)
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """The series an instant query returns (a vector's samples; a scalar or string is refused)."""
        data = self.api("query", query=expr, time=str(at if at is not None else time.time()))
        if data["resultType"] != "vector":
            raise PrometheusError(f"{expr!r} is a {data['resultType']}, not a vector of series")
        return list(data["result"])

    def label_values(self, label: str, match: str) -> list[str]:
        return list(self.api(f"label/{label}/values", **{"match[]": match}))

    def targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets", state="active")["activeTargets"])
