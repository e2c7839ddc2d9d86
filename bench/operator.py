"""`python -m bench.operator`: N InferenceModels created at once against the local control plane, timed from the
API server's audit log (apply -> children), `kubectl get` polls (-> Ready), and the operator's /proc counters."""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import datetime
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.stats import percentile

# The children one single-version model gets: its Deployment, its version Service, the model Service, the
# NetworkPolicy. A child exists from the operator's first successful apply of it: usually 201 Created, but an
# apply the server timed out (504) may still have created it, and the next apply answers 200.
CHILD_RESOURCES = frozenset({"deployments", "services", "networkpolicies"})
CHILDREN_PER_MODEL = 4
NODE_PODS = 500  # per simulated node the benchmark adds, so scheduling never limits it
READY_POLL_S = 10.0
STEADY_GAP_S = 0.5  # between the steady phase's creates: 2 models/s, each kubectl process ~0.2 s itself


@dataclass(frozen=True)
class Timings:
    """What the audit log and the Ready polls give, per model, in seconds from that model's create."""

    to_children: dict[str, float]  # until its last child was created
    all_children_s: float | None  # first create -> every model's children exist
    missing_children: tuple[str, ...]


def model_of(name: str, models: Mapping[str, str]) -> str | None:
    """The model a child belongs to: "<model>" (model Service, NetworkPolicy) or "<model>-v1"."""
    return models.get(name) or models.get(name.rsplit("-", 1)[0])


def child_timings(requests: Iterable[Any], namespace: str, models: Sequence[str]) -> Timings:
    """Apply -> children per model from audit entries (e2e.faults.Request): the CR's create, then the operator's
    first successful apply of each of its children."""
    by_name = {m: m for m in models}
    created: dict[str, datetime.datetime] = {}
    children: dict[str, dict[tuple[str, str], datetime.datetime]] = collections.defaultdict(dict)
    for request in requests:
        if request.namespace != namespace:
            continue
        if request.resource == "inferencemodels" and request.verb == "create" and request.code == 201:
            created[request.name] = request.received
        elif request.resource in CHILD_RESOURCES and request.verb == "patch" and request.code in (200, 201):
            model = model_of(request.name, by_name)
            if model is not None and request.from_operator:
                first = children[model].setdefault((request.resource, request.name), request.received)
                children[model][(request.resource, request.name)] = min(first, request.received)
    done = {m: max(children[m].values()) for m in models if m in created and len(children[m]) >= CHILDREN_PER_MODEL}
    to_children = {m: (at - created[m]).total_seconds() for m, at in done.items()}
    missing = tuple(m for m in models if m not in to_children)
    all_children = None
    if created and not missing:
        all_children = (max(done.values()) - min(created.values())).total_seconds()
    return Timings(to_children, all_children, missing)


def all_ready_at(lines: Sequence[str], count: int) -> datetime.datetime | None:
    """The latest Ready=True transition among "STATUS=LASTTRANSITIONTIME" lines, once `count` models are Ready."""
    times = [line.split("=", 1)[1] for line in lines if line.startswith("True=")]
    if len(times) < count or not all(times):
        return None
    return max(datetime.datetime.fromisoformat(t.replace("Z", "+00:00")) for t in times)


def process_usage(pid: int) -> tuple[float, int]:
    """(CPU seconds, user + system, and peak RSS in bytes) of a running process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    peak_kb = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmHWM")
    )
    return cpu_s, peak_kb * 1024


def component_pids(pid_dir: Path) -> dict[str, int]:
    """kwokctl's components (kube-apiserver, etcd, ...) by name -> pid, from its pids/ directory."""
    return {f.stem: int(f.read_text().strip()) for f in sorted(pid_dir.glob("*.pid")) if f.read_text().strip()}


def bench_model(name: str, namespace: str) -> dict[str, Any]:
    """The smallest model: one CPU version, one replica (kwok marks its pod Ready; nothing runs)."""
    return {
        "apiVersion": "skiff.dev/v1alpha1",
        "kind": "InferenceModel",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "versions": [{"name": "v1", "modelUri": "pvc://models/bench/v1", "replicas": 1}],
            "resources": {"cpu": "100m", "memory": "128Mi"},
        },
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.operator", description=__doc__)
    parser.add_argument("--models", type=int, default=1000, help="InferenceModels created at once (default 1000)")
    parser.add_argument("--timeout-s", type=float, default=900, help="give up waiting for Ready after this long")
    parser.add_argument("--idle-s", type=float, default=30, help="then count the idle operator's requests this long")
    parser.add_argument("--keep-logs", type=Path, help="copy the audit log and the operator's log into this folder")
    parser.add_argument("--create-workers", type=int, default=8, help="concurrent `kubectl create` processes")
    parser.add_argument(
        "--steady",
        type=int,
        default=50,
        help="then create this many more models one at a time, STEADY_GAP_S apart, while the operator holds the "
        "others: apply -> children as a user meets it (default 50; 0: skip)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.models < 1:
        print("--models must be at least 1", file=sys.stderr)
        return 2
    # Imported here: the pure helpers above (and their tests) need no control plane.
    from devtools.cluster import cluster, eventually, node_manifest, node_ready
    from devtools.install import create_model_claims, install_crd
    from e2e.faults import AuditLog, count_by_verb, count_by_verb_and_resource
    from e2e.harness import OperatorProcess

    namespace = "bench"
    names = [f"m{i:05d}" for i in range(args.models)]
    with cluster(use_user_cluster=False) as kube, tempfile.TemporaryDirectory(prefix="skiff-bench-") as scratch:
        from devtools.cluster import local_control_plane

        plane = local_control_plane(kube)
        assert plane is not None
        audit = AuditLog(plane.audit_log)
        install_crd(kube)
        nodes = [
            node_manifest(f"bench-{i}", allocatable={"cpu": "1000", "memory": "4Ti", "pods": str(NODE_PODS)})
            for i in range(args.models // NODE_PODS + 1)
        ]
        kube.apply(nodes)
        eventually(
            lambda: all(node_ready(kube.get("node", n["metadata"]["name"])) for n in nodes),
            timeout=120,
            what="the benchmark's simulated nodes to be Ready",
        )
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        eventually(lambda: kube.get_or_none("serviceaccount", "default", namespace), timeout=60, what="serviceaccount")
        create_model_claims(kube, namespace, ["models"])
        operator = OperatorProcess(kube, namespace, Path(scratch) / "operator.log", ["--resync-seconds", "60"])
        operator.start()  # returns once kopf has logged in (its import takes 15-20 s on a loaded box)
        try:
            time.sleep(2)  # kopf's initial lists and watches
            assert operator.process is not None
            start_cpu, _ = process_usage(operator.process.pid)
            components = component_pids(plane.cluster_dir / "pids")
            start_components = {name: process_usage(pid)[0] for name, pid in components.items()}
            since = audit.mark()
            print(f"creating {args.models} InferenceModels with {args.create_workers} kubectl processes", flush=True)
            started = datetime.datetime.now(datetime.UTC)
            chunks = [names[i :: args.create_workers] for i in range(args.create_workers)]
            with concurrent.futures.ThreadPoolExecutor(args.create_workers) as pool:
                list(
                    pool.map(
                        lambda chunk: kube.run(
                            "create", "-f", "-", stdin="\n---\n".join(_yaml(bench_model(n, namespace)) for n in chunk)
                        ),
                        [c for c in chunks if c],
                    )
                )
            created_s = (datetime.datetime.now(datetime.UTC) - started).total_seconds()
            print(f"created in {created_s:.1f}s; waiting for every model to be Ready", flush=True)
            ready_at = _wait_all_ready(kube, namespace, len(names), started, args.timeout_s)
            all_ready_s = (ready_at - started).total_seconds() if ready_at else None
            busy = audit.requests(since)
            busy_cpu, _ = process_usage(operator.process.pid)
            busy_components = {name: process_usage(pid)[0] - start_components[name] for name, pid in components.items()}
            idle_mark = audit.mark()
            time.sleep(args.idle_s)
            idle = [r for r in audit.requests(idle_mark) if r.from_operator]
            end_cpu, peak_rss = process_usage(operator.process.pid)
            steady_names = [f"s{i:05d}" for i in range(args.steady)]
            steady_mark = audit.mark()
            if steady_names:
                print(f"creating {len(steady_names)} more models one at a time, {STEADY_GAP_S}s apart", flush=True)
            for name in steady_names:
                kube.run("create", "-f", "-", stdin=_yaml(bench_model(name, namespace)))
                time.sleep(STEADY_GAP_S)
            time.sleep(3 if steady_names else 0)  # the last one's children
            steady = child_timings(audit.requests(steady_mark), namespace, steady_names)
            peak_rss = max(peak_rss, process_usage(operator.process.pid)[1])
        finally:
            operator.stop()
            if args.keep_logs:
                args.keep_logs.mkdir(parents=True, exist_ok=True)
                shutil.copy(plane.audit_log, args.keep_logs / "audit.log")
                shutil.copy(Path(scratch) / "operator.log", args.keep_logs / "operator.log")
        timings = child_timings(busy, namespace, names)
        operator_requests = [r for r in busy if r.from_operator]
        steady_values = list(steady.to_children.values())
        report = {
            "models": args.models,
            "create_s": round(created_s, 1),
            "apply_to_children_p50_s": round(percentile(list(timings.to_children.values()), 50), 3),
            "apply_to_children_p99_s": round(percentile(list(timings.to_children.values()), 99), 3),
            "all_children_s": timings.all_children_s and round(timings.all_children_s, 1),
            "models_without_all_children": len(timings.missing_children),
            "all_ready_s": all_ready_s and round(all_ready_s, 1),
            "operator_requests": len(operator_requests),
            "operator_requests_per_model": round(len(operator_requests) / args.models, 1),
            "operator_requests_by_verb": count_by_verb(operator_requests),
            "operator_requests_by_resource": {
                f"{v} {r}": n for (v, r), n in count_by_verb_and_resource(operator_requests).items()
            },
            "operator_cpu_s_until_ready": round(busy_cpu - start_cpu, 1),
            "control_plane_cpu_s_until_ready": {name: round(cpu, 1) for name, cpu in sorted(busy_components.items())},
            "steady_models": args.steady,
            "steady_apply_to_children_p50_s": round(percentile(steady_values, 50), 3) if steady_values else None,
            "steady_apply_to_children_p99_s": round(percentile(steady_values, 99), 3) if steady_values else None,
            "steady_without_all_children": len(steady.missing_children),
            "idle_window_s": args.idle_s,
            "idle_requests": {f"{v} {r}": n for (v, r), n in count_by_verb_and_resource(idle).items()},
            "idle_cpu_s": round(end_cpu - busy_cpu, 2),
            "operator_peak_rss_mb": round(peak_rss / 2**20),
            "cpus": os.cpu_count(),
        }
    for key, value in report.items():
        print(f"{key}: {value}")
    return 0 if all_ready_s is not None else 1


def _yaml(document: Mapping[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(dict(document))


def _wait_all_ready(
    kube: Any, namespace: str, count: int, started: datetime.datetime, timeout_s: float
) -> datetime.datetime | None:
    """When every model in `namespace` showed Ready=True, None on timeout. Polled every READY_POLL_S only to know
    when to stop: the moment itself is the latest Ready condition's lastTransitionTime (the operator's clock, this
    machine's, to the second), so the poll (a `kubectl` process listing every model) can be rare and takes little
    of the CPU the control plane and the operator share."""
    cond = '.status.conditions[?(@.type=="Ready")]'
    query = f'{{range .items[*]}}{{{cond}.status}}={{{cond}.lastTransitionTime}}{{"\\n"}}{{end}}'
    while (datetime.datetime.now(datetime.UTC) - started).total_seconds() < timeout_s:
        lines = kube.run("get", "inferencemodels", "-n", namespace, "-o", f"jsonpath={query}").split()
        ready_at = all_ready_at(lines, count)
        if ready_at is not None:
            return ready_at
        elapsed = (datetime.datetime.now(datetime.UTC) - started).total_seconds()
        ready = sum(1 for line in lines if line.startswith("True="))
        with_condition = sum(1 for line in lines if not line.startswith("="))
        print(f"  {elapsed:5.0f}s: {ready}/{count} Ready, {with_condition} with a Ready condition", flush=True)
        time.sleep(READY_POLL_S)
    return None


if __name__ == "__main__":
    raise SystemExit(main())
