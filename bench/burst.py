"""`python -m bench.burst`: a user's `kubectl apply` of N InferenceModels timed with no operator and again while
the operator reconciles them, on the local control plane (kwok nodes), with the time until all are Ready, the API
server's audit log of the burst counted by user agent and verb, and the time requests waited in API Priority and
Fairness queues by priority level: does the operator crowd the user out?

Identities (`--identities`): `chart` (the default) installs the chart (its Role, FlowSchema and priority level,
admission policy) and runs the operator as the chart's ServiceAccount with the chart Deployment's arguments, and the
user as a ServiceAccount that may only write InferenceModels (a non-admin: APF's `service-accounts` schema,
`workload-low`); `admin` runs both with the control plane's admin certificate (`system:masters`: APF's `exempt`
level, so priority plays no part). Both phases run in one namespace, under the same admission policy: the user's
models are applied with the operator stopped, deleted, then applied again while it runs."""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from bench.operator import NODE_PODS, _wait_all_ready, _yaml

FILES = 5  # the user's N models in 5 files, applied one after another (the measurement)
TARGET_RATIO = 2.0
TARGET_READY_S = 120.0
NAMESPACE = "burst"
USER = "burst-user"
# The wait histogram of API Priority and Fairness (kube-apiserver /metrics): seconds requests spent queued.
_WAIT = re.compile(
    r"^apiserver_flowcontrol_request_wait_duration_seconds_(sum|count)\{(?P<labels>[^}]*)\} (?P<value>\S+)$"
)
_LEVEL = re.compile(r'priority_level="([^"]*)"')


def by_agent_and_verb(requests: Iterable[Any]) -> dict[str, int]:
    """Requests counted by the user agent's program name (before the first '/') and verb, most first."""
    counts = collections.Counter(f"{r.user_agent.split('/', 1)[0] or '-'} {r.verb}" for r in requests)
    return dict(counts.most_common())


def queue_waits(metrics: str) -> dict[str, tuple[float, float]]:
    """(requests, seconds waited) per priority level, summed over flow schemas and execution, from the API server's
    Prometheus text."""
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for line in metrics.splitlines():
        match = _WAIT.match(line)
        level = match and _LEVEL.search(match.group("labels"))
        if match and level:
            totals[level.group(1)][0 if match.group(1) == "count" else 1] += float(match.group("value"))
    return {name: (count, seconds) for name, (count, seconds) in totals.items()}


def waits_between(
    before: Mapping[str, tuple[float, float]], after: Mapping[str, tuple[float, float]]
) -> dict[str, str]:
    """Per priority level that served requests in between: how many, and their mean queue wait, busiest first."""
    rows = []
    for level, (count, seconds) in after.items():
        done = count - before.get(level, (0.0, 0.0))[0]
        waited = seconds - before.get(level, (0.0, 0.0))[1]
        if done > 0:
            rows.append((done, level, waited))
    return {level: f"{done:.0f} requests, mean wait {1000 * waited / done:.1f} ms" for done, level, waited in
            sorted(rows, reverse=True)}  # fmt: skip


def timed_apply(kube: Any, documents: Sequence[dict[str, Any]]) -> float:
    """Seconds for `kubectl apply` of the documents in FILES files, one after another."""
    chunk = -(-len(documents) // FILES)
    started = time.monotonic()
    for start in range(0, len(documents), chunk):
        kube.run("apply", "-f", "-", stdin="\n---\n".join(_yaml(d) for d in documents[start : start + chunk]),
                 timeout=900)  # fmt: skip
    return time.monotonic() - started


# The non-admin user: a ServiceAccount that may write InferenceModels and read the claim they mount (the chart's
# admission policy checks that), nothing else.
USER_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["skiff.dev"], "resources": ["inferencemodels"],
     "verbs": ["get", "list", "watch", "create", "patch", "delete", "deletecollection"]},
    {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get"]},
]  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.burst", description=__doc__)
    parser.add_argument("--models", type=int, default=1000, help="InferenceModels the user applies (default 1000)")
    parser.add_argument("--timeout-s", type=float, default=900, help="give up waiting for Ready after this long")
    parser.add_argument(
        "--identities", choices=("chart", "admin"), default="chart",
        help="chart: the chart's ServiceAccount and priority level for the operator, a non-admin user (default); "
        "admin: both as system:masters (APF exempt)",
    )  # fmt: skip
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.models < FILES:
        print(f"--models must be at least {FILES}", file=sys.stderr)
        return 2
    # Imported here: the pure helpers above need no control plane.
    from devtools.cluster import Kubectl, cluster, eventually, local_control_plane, node_manifest, node_ready
    from devtools.helm import Helm, helm_binary
    from devtools.install import create_model_claims, install_crd
    from devtools.models import small_model
    from devtools.prometheus import service_account_kubeconfig as service_account_with_rules
    from e2e.faults import AuditLog, count_by_verb_and_resource
    from e2e.harness import (
        ChartOperator,
        OperatorProcess,
        chart_deployment,
        install_chart,
        service_account_kubeconfig,
    )

    with cluster(use_user_cluster=False) as kube, tempfile.TemporaryDirectory(prefix="skiff-burst-") as scratch:
        plane = local_control_plane(kube)
        assert plane is not None
        audit = AuditLog(plane.audit_log)
        flow_schemas = [f["metadata"]["name"] for f in kube.get("flowschemas")["items"]]
        install_crd(kube)
        nodes = [
            node_manifest(f"burst-{i}", allocatable={"cpu": "1000", "memory": "4Ti", "pods": str(NODE_PODS)})
            for i in range(args.models // NODE_PODS + 1)
        ]
        kube.apply(nodes)
        eventually(lambda: all(node_ready(kube.get("node", n["metadata"]["name"])) for n in nodes), timeout=120,
                   what="the simulated nodes to be Ready")  # fmt: skip
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        eventually(lambda: kube.get_or_none("serviceaccount", "default", NAMESPACE), timeout=60, what="sa")
        create_model_claims(kube, NAMESPACE, ["models"])
        user = kube
        operator_ctx: AbstractContextManager[Any]
        if args.identities == "chart":
            binary = helm_binary()
            if binary is None:
                print("helm not found; run: make controlplane", file=sys.stderr)
                return 2
            print("installing the chart (its Role, FlowSchema, priority level, admission policy)", flush=True)
            install_chart(Helm(binary, kubeconfig=kube.kubeconfig), NAMESPACE, "crds.install=false")
            user_kubeconfig = Path(scratch) / "user"
            user_kubeconfig.write_text(service_account_with_rules(kube, NAMESPACE, USER, USER_RULES))
            user = Kubectl(user_kubeconfig, kube.binary)
            operator_kubeconfig = service_account_kubeconfig(kube, NAMESPACE, "skiff", Path(scratch) / "operator")
            operator_ctx = ChartOperator(chart_deployment(kube, NAMESPACE), operator_kubeconfig,
                                         Path(scratch) / "operator.log")  # fmt: skip
        else:
            operator_ctx = _Started(
                OperatorProcess(kube, NAMESPACE, Path(scratch) / "operator.log", ["--resync-seconds", "60"])
            )

        names = [f"m{i:05d}" for i in range(args.models)]
        alone_mark = audit.mark()
        alone_s = timed_apply(user, [small_model(NAMESPACE, n) for n in names])
        alone = audit.requests(alone_mark)
        print(f"no operator: kubectl apply of {args.models} models in {alone_s:.1f} s", flush=True)
        user.run("delete", "inferencemodels", "--all", "-n", NAMESPACE, "--wait=true", timeout=900)
        print("deleted them; starting the operator", flush=True)

        with operator_ctx:
            time.sleep(2)  # kopf's initial lists and watches
            waits_before = queue_waits(kube.run("get", "--raw", "/metrics"))
            busy_mark = audit.mark()
            started = datetime.datetime.now(datetime.UTC)
            busy_s = timed_apply(user, [small_model(NAMESPACE, n) for n in names])
            print(f"operator running: kubectl apply of {args.models} models in {busy_s:.1f} s", flush=True)
            ready_at = _wait_all_ready(kube, NAMESPACE, args.models, started, args.timeout_s)
            busy = audit.requests(busy_mark)
            waits = waits_between(waits_before, queue_waits(kube.run("get", "--raw", "/metrics")))
    ready_s = (ready_at - started).total_seconds() if ready_at else None
    ratio = busy_s / alone_s
    report = {
        "models": args.models,
        "identities": args.identities,
        "apf_flow_schemas": len(flow_schemas),
        "apply_alone_s": round(alone_s, 1),
        "apply_with_operator_s": round(busy_s, 1),
        "ratio": f"{ratio:.2f}x (target <= {TARGET_RATIO}x: {'met' if ratio <= TARGET_RATIO else 'missed'})",
        "all_ready_s": f"{ready_s and round(ready_s, 1)} (target < {TARGET_READY_S:.0f} s: "
        f"{'met' if ready_s is not None and ready_s < TARGET_READY_S else 'missed'})",
        "apf_queue_wait_by_priority_level": waits,
        "requests_alone_by_agent_verb": by_agent_and_verb(alone),
        "requests_with_operator_by_agent_verb": by_agent_and_verb(busy),
        "operator_requests_by_verb_resource": {
            f"{v} {r}": n for (v, r), n in count_by_verb_and_resource(r for r in busy if r.from_operator).items()
        },
        "load_average": os.getloadavg(),
        "cpus": os.cpu_count(),
    }
    for key, value in report.items():
        print(f"{key}: {value}")
    return 0 if ready_s is not None else 1


class _Started:
    """An OperatorProcess as a context manager: started on entry, stopped on exit."""

    def __init__(self, process: Any) -> None:
        self.process = process

    def __enter__(self) -> Any:
        self.process.start()
        return self.process

    def __exit__(self, *_: object) -> None:
        self.process.stop()


if __name__ == "__main__":
    raise SystemExit(main())
