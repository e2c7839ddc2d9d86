"""A real Prometheus (devtools/prometheus.py) scrapes a runtime pod on the real node the way the chart's
ServiceMonitor says - Kubernetes discovery through a ServiceAccount with only the read access docs/observability.md
names - while load runs, and every query of the chart's Grafana dashboard, its variables substituted, returns
series; a query on a metric nobody exports returns none, so the check can fail. The tests run in file order (the
negative control reads the counters the load test made).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import tritonclient.grpc as triton
from devtools.cluster import Kubectl, eventually
from devtools.helm import Helm, documents
from devtools.images import Images
from devtools.models import real_model
from devtools.node.real_node import RealNode
from devtools.prometheus import (
    DISCOVERY_RULES,
    INSTALL_HINT,
    Prometheus,
    prometheus_binary,
    scrape_jobs,
    service_account_kubeconfig,
)
from devtools.traffic import INPUT, write_sample_model

from e2e.harness import OperatorProcess, wait_model_ready
from e2e.real_models import create_real_namespace, delete_real_namespace
from skiff_operator import contract

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

MODEL = "observed-cpu"
VERSION = "v1"
RATE_INTERVAL = "20s"  # what Grafana's $__rate_interval is at a 2 s scrape interval and a 15 s step
# Queries of metrics only a GPU pod exports (NVML): run, and expected empty, on the CPU-only real node.
GPU_ONLY = ("gpu_utilization", "gpu_memory_used_bytes")


@dataclass(frozen=True)
class Observed:
    namespace: str
    prometheus: Prometheus
    pod: dict[str, Any]
    dashboard: dict[str, Any]


def chart_objects(helm: Helm, namespace: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The chart's ServiceMonitor and dashboard, rendered for a release serving `namespace`."""
    rendered = documents(
        helm.template(
            "serviceMonitor.enabled=true",
            'serviceMonitor.interval="2s"',
            f'watchNamespaces=["{namespace}"]',
            "dashboard.enabled=true",
        )
    )
    (monitor,) = [d for d in rendered if d["kind"] == "ServiceMonitor" and d["metadata"]["name"].endswith("-runtime")]
    (config_map,) = [d for d in rendered if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"]["labels"]]
    return monitor, json.loads(config_map["data"]["skiff-runtime.json"])


def substituted(expr: str, namespace: str) -> str:
    """A dashboard query as Grafana sends it for this namespace, model and version."""
    values = {"$namespace": namespace, "$model": MODEL, "$version": VERSION, "$__rate_interval": RATE_INTERVAL}
    for variable, value in values.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"a variable the test does not substitute: {expr}"
    return expr


def send_load(target: str, stop: threading.Event, sent: dict[str, int]) -> None:
    """Inferences (and a bad one in ten: an input the model lacks, INVALID_ARGUMENT) until `stop`."""
    client = triton.InferenceServerClient(target)
    good = triton.InferInput("image", list(INPUT.shape), "FP32")
    good.set_data_from_numpy(INPUT)
    bad = triton.InferInput("nope", list(INPUT.shape), "FP32")
    bad.set_data_from_numpy(INPUT)
    try:
        n = 0
        while not stop.is_set():
            request = bad if n % 10 == 9 else good
            try:
                client.infer(MODEL, [request], client_timeout=10)
                sent["OK"] = sent.get("OK", 0) + 1
            except triton.InferenceServerException as error:
                sent[str(error.status())] = sent.get(str(error.status()), 0) + 1
            n += 1
            time.sleep(0.02)
    finally:
        client.close()


@pytest.fixture(scope="module")
def observed(
    real_node: RealNode, kube: Kubectl, crd: dict[str, Any], helm: Helm, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Observed]:
    binary = prometheus_binary()
    if binary is None:
        pytest.fail(f"prometheus is not built; run: {INSTALL_HINT}", pytrace=False)
    if not real_node.running:
        real_node.start()
    namespace = f"e2e-observe-{uuid.uuid4().hex[:6]}"
    models = create_real_namespace(kube, real_node, namespace)
    write_sample_model(models / "sample-cnn" / "v1")
    scratch = tmp_path_factory.mktemp("observability")
    operator = OperatorProcess(kube, namespace, scratch / "operator.log")
    operator.start()
    prometheus = Prometheus(scratch / "prometheus", binary)
    try:
        kube.apply(real_model(namespace, MODEL, "pvc://models/sample-cnn/v1", Images.from_script().runtime))
        monitor, dashboard = chart_objects(helm, namespace)
        kubeconfig = scratch / "prometheus.kubeconfig"
        kubeconfig.write_text(service_account_kubeconfig(kube, namespace, "prometheus", DISCOVERY_RULES))
        namespaces = monitor["spec"]["namespaceSelector"]["matchNames"]
        assert namespaces == [namespace]
        prometheus.start(scrape_jobs(monitor, namespaces, kubeconfig))
        wait_model_ready(kube, namespace, MODEL, timeout_s=300)
        (pod,) = kube.items("pods", namespace, f"skiff.dev/model={MODEL}")
        yield Observed(namespace, prometheus, pod, dashboard)
    finally:
        prometheus.stop()
        operator.stop()
        print(f"---- prometheus log ----\n{prometheus.log()[-5000:]}")
        print(f"---- operator log ----\n{operator.log()[-10000:]}")
        print(f"---- runtime log ----\n{real_node.container_log(namespace, f'{MODEL}-*', 'runtime')[-5000:]}")
        delete_real_namespace(kube, namespace)


def empty_queries(prometheus: Prometheus, queries: list[str]) -> list[str]:
    return [q for q in queries if not prometheus.query(q)]


def test_prometheus_scrapes_the_version_service_pod_once_with_model_and_version_labels(observed: Observed) -> None:
    prometheus, pod = observed.prometheus, observed.pod

    def up() -> list[dict[str, Any]] | None:
        series = prometheus.query(f'up{{namespace="{observed.namespace}"}} == 1')
        return series or None

    (series,) = eventually(up, timeout=90, interval=1, what=f"up == 1 for the pod (targets: {prometheus.targets()})")
    labels = series["metric"]
    assert labels["pod"] == pod["metadata"]["name"]
    assert labels["instance"] == f"{pod['status']['podIP']}:{contract.METRICS_PORT}"
    assert (labels["model"], labels["version"], labels["endpoint"]) == (MODEL, VERSION, "metrics")
    assert labels["service"] != MODEL  # the version Service's endpoints; the model's own Service is left out
    ours = [t for t in prometheus.targets() if t["labels"].get("namespace") == observed.namespace]
    assert len(ours) == 1, ours


def test_every_dashboard_query_returns_series_under_load(observed: Observed, kube: Kubectl) -> None:
    prometheus, namespace = observed.prometheus, observed.namespace
    queries = [substituted(t["expr"], namespace) for p in observed.dashboard["panels"] for t in p["targets"]]
    needed = [q for q in queries if not any(name in q for name in GPU_ONLY)]
    gpu = [q for q in queries if q not in needed]
    assert len(needed) >= 15
    assert len(gpu) == 2

    stop, sent = threading.Event(), {}
    target = f"{observed.pod['status']['podIP']}:{contract.GRPC_PORT}"
    load = threading.Thread(target=send_load, args=(target, stop, sent), daemon=True)
    load.start()
    try:
        eventually(
            lambda: not empty_queries(prometheus, needed) or None,
            timeout=120,
            interval=2,
            what="every dashboard query answering series",
        )
    except AssertionError:
        pytest.fail(f"queries without series after 120 s of load: {empty_queries(prometheus, needed)}; sent {sent}")
    finally:
        stop.set()
        load.join(timeout=30)
    assert sent.get("OK", 0) > 0
    assert sent.get("StatusCode.INVALID_ARGUMENT", 0) > 0, sent
    for query in needed:
        series = prometheus.query(query)
        assert series, query
        print(f"{query}\n  -> {json.dumps(series)[:400]}")
    for query in gpu:  # valid PromQL, and empty where no GPU is (a GPU pod would answer them)
        assert prometheus.query(query) == [], query

    # The variables, as Grafana's label_values() asks for them.
    assert namespace in prometheus.label_values("namespace", "skiff_model_ready")
    assert prometheus.label_values("model", f'skiff_model_ready{{namespace="{namespace}"}}') == [MODEL]
    assert prometheus.label_values("version", f'skiff_model_ready{{namespace="{namespace}",model="{MODEL}"}}') == [
        VERSION
    ]


def test_a_query_on_a_metric_nobody_exports_returns_no_series(observed: Observed) -> None:
    """The negative control: the check above would fail on a query that matches nothing."""
    prometheus = observed.prometheus
    missing = f'sum(rate(skiff_no_such_metric_total{{namespace="{observed.namespace}"}}[{RATE_INTERVAL}]))'
    present = f'sum(rate(grpc_server_handled_total{{namespace="{observed.namespace}"}}[5m]))'
    assert empty_queries(prometheus, [missing, present]) == [missing]
    assert prometheus.query(f'skiff_model_ready{{namespace="{observed.namespace}",model="not-{MODEL}"}}') == []


def test_the_discovery_account_may_read_no_secrets(observed: Observed, kube: Kubectl) -> None:
    account = f"system:serviceaccount:{observed.namespace}:prometheus"
    for verb, resource, allowed in [("list", "endpoints", "yes"), ("watch", "pods", "yes"), ("get", "secrets", "no")]:
        done = kube.attempt("auth", "can-i", verb, resource, "-n", observed.namespace, "--as", account)
        assert done.stdout.strip() == allowed, (verb, resource, done.stdout, done.stderr)
    done = kube.attempt("auth", "can-i", "list", "pods", "-n", "default", "--as", account)
    assert done.stdout.strip() == "no"
