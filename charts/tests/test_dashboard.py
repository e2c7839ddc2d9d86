"""The Grafana dashboard in the chart: a ConfigMap only when `dashboard.enabled`, labelled for Grafana's sidecar,
holding dashboards/skiff-runtime.json verbatim; every query filtered by the namespace/model/version variables and
naming only metrics the runtime exports. (e2e/test_prometheus_scrape.py runs every query on a real Prometheus.)"""

from __future__ import annotations

import json
import re
from types import SimpleNamespace
from typing import Any

import pytest
from devtools.helm import CHART, Helm, documents
from prometheus_client import generate_latest

from skiff_runtime.metrics import RuntimeMetrics

DASHBOARD = CHART / "dashboards" / "skiff-runtime.json"
FILTER = 'namespace="$namespace", model="$model", version=~"$version"'
# Metric names in a PromQL expression: an identifier followed by `{` (every query here selects with labels).
SELECTED = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{")


class OneGpu:
    """The pynvml calls the runtime's GPU collector makes, for one GPU (the real ones need a driver)."""

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return "GPU-0"

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=50)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(used=1, total=2)


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def queries() -> list[str]:
    return [target["expr"] for panel in dashboard()["panels"] for target in panel["targets"]]


def exported_names() -> set[str]:
    """Every sample name a runtime's page can carry (counters' _total, histograms' _bucket/_sum/_count)."""
    metrics = RuntimeMetrics("m", "v1")
    metrics.watch_gpus({}, OneGpu())
    metrics.observe_rpc("/inference.GRPCInferenceService/ModelInfer", "OK", 0.01, 10, 10)
    metrics.observe_http("/v2/models/{model}/infer", 200, 0.01, 10, 10)
    text = generate_latest(metrics.registry).decode()
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    return names


def test_the_dashboard_is_off_by_default_and_a_labelled_config_map_when_on(helm: Helm) -> None:
    kinds = [d["kind"] for d in documents(helm.template())]
    assert "ConfigMap" not in kinds
    (config_map,) = [d for d in documents(helm.template("dashboard.enabled=true")) if d["kind"] == "ConfigMap"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == "skiff-system"
    assert json.loads(config_map["data"]["skiff-runtime.json"]) == dashboard()


def test_the_dashboard_has_the_panels_issue_34_asks_for() -> None:
    titles = " | ".join(panel["title"] for panel in dashboard()["panels"]).lower()
    for wanted in ("rate", "errors by grpc code", "p50 / p99", "queue depth", "queue time", "batch size", "gpu"):
        assert wanted in titles, f"no panel on {wanted!r}: {titles}"
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert set(variables) == {"datasource", "namespace", "model", "version"}
    assert variables["version"]["multi"] is True
    assert variables["version"]["allValue"] == ".+"


@pytest.mark.parametrize("expr", queries())
def test_every_query_is_filtered_by_the_variables_and_names_exported_metrics(expr: str) -> None:
    selectors = SELECTED.findall(expr)
    assert selectors, expr
    assert expr.count(FILTER) == len(selectors), f"a selector lacks {FILTER}: {expr}"
    unknown = set(selectors) - exported_names()
    assert not unknown, f"{expr} names metrics the runtime does not export: {unknown}"


def test_the_name_check_catches_a_metric_the_runtime_does_not_export() -> None:
    assert "grpc_server_handled_total" in exported_names()
    assert "grpc_server_handling_seconds_bucket" in exported_names()
    assert "gpu_utilization" in exported_names()
    assert "grpc_server_handled" not in exported_names()
