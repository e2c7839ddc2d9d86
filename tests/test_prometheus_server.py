"""devtools/prometheus.py: the chart's ServiceMonitor as the scrape job the Prometheus Operator would write, loaded
and served by the real Debian Prometheus (its config checks refuse anything 2.42 does not take), and the query API
answering series, refusing a broken query with Prometheus' own words."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from devtools.prometheus import INSTALL_HINT, Prometheus, PrometheusError, prometheus_binary, scrape_jobs

MONITOR: dict[str, Any] = {  # charts/skiff/templates/servicemonitor.yaml rendered for the namespace "ml"
    "metadata": {"name": "skiff-runtime", "namespace": "skiff-system"},
    "spec": {
        "namespaceSelector": {"matchNames": ["ml"]},
        "selector": {
            "matchLabels": {
                "app.kubernetes.io/name": "skiff-runtime",
                "app.kubernetes.io/managed-by": "skiff-operator",
            },
            "matchExpressions": [{"key": "skiff.dev/version", "operator": "Exists"}],
        },
        "endpoints": [
            {
                "port": "metrics",
                "interval": "2s",
                "relabelings": [
                    {"sourceLabels": ["__meta_kubernetes_pod_label_skiff_dev_model"], "targetLabel": "model"},
                    {"sourceLabels": ["__meta_kubernetes_pod_label_skiff_dev_version"], "targetLabel": "version"},
                ],
            }
        ],
    },
}


@pytest.fixture
def binary() -> str:
    found = prometheus_binary()
    if found is None:
        if os.environ.get("SKIFF_E2E_REQUIRED") == "1":
            pytest.fail(f"prometheus not found; run: {INSTALL_HINT} (SKIFF_E2E_REQUIRED=1)", pytrace=False)
        pytest.skip(f"prometheus not found; run: {INSTALL_HINT}")
    return found


def test_the_service_monitor_becomes_keep_rules_then_target_labels_then_its_relabelings() -> None:
    (job,) = scrape_jobs(MONITOR, ["ml"], Path("/k"))
    assert job["job_name"] == "serviceMonitor/skiff-system/skiff-runtime/0"
    assert job["scrape_interval"] == "2s"
    assert job["kubernetes_sd_configs"] == [
        {"role": "endpoints", "kubeconfig_file": "/k", "namespaces": {"names": ["ml"]}}
    ]
    rules = job["relabel_configs"]
    assert rules[0] == {
        "action": "keep",
        "source_labels": [
            "__meta_kubernetes_service_label_app_kubernetes_io_managed_by",
            "__meta_kubernetes_service_labelpresent_app_kubernetes_io_managed_by",
        ],
        "regex": "(skiff\\-operator);true",
    }
    assert {"action": "keep", "source_labels": ["__meta_kubernetes_service_labelpresent_skiff_dev_version"],
            "regex": "true"} in rules  # fmt: skip
    assert {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": "metrics"} in rules
    targets = [rule["target_label"] for rule in rules if "target_label" in rule]
    assert targets == ["namespace", "service", "pod", "container", "job", "endpoint", "model", "version"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"selector": {"matchExpressions": [{"key": "a", "operator": "Gt"}]}}, "operator 'Gt'"),
        ({"endpoints": [{"targetPort": 8003}]}, "name a port"),
        ({"endpoints": [{"port": "metrics", "relabelings": [{"sourceLabels": ["a"], "foo": 1}]}]}, "['foo']"),
    ],
)
def test_what_the_translation_does_not_know_is_refused_by_name(change: dict[str, Any], message: str) -> None:
    monitor = {**MONITOR, "spec": {**MONITOR["spec"], **change}}
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        scrape_jobs(monitor, ["ml"], Path("/k"))


def test_a_real_prometheus_loads_the_job_and_answers_queries(binary: str, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"  # nothing listens there: discovery fails, the config still loads
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    prometheus = Prometheus(tmp_path / "prometheus", binary)
    prometheus.start(scrape_jobs(MONITOR, ["ml"], kubeconfig))
    try:
        (series,) = prometheus.query('label_replace(vector(1), "a", "b", "", "")')
        assert series["metric"] == {"a": "b"}
        assert prometheus.query("up") == []  # no target discovered: no series
        with pytest.raises(PrometheusError, match=r"bad_data: .*parse error"):
            prometheus.query("sum(")
        with pytest.raises(PrometheusError, match="not a vector"):
            prometheus.query("1")
    finally:
        prometheus.stop()
    assert "Server is ready to receive web requests" in prometheus.log()
