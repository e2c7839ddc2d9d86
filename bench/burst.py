"""`python -m bench.burst`: a user's `kubectl apply` of N InferenceModels timed with no operator and again while
the operator reconciles them, on the local control plane (kwok nodes), with the time until all are Ready and the
API server's audit log of the burst counted by user agent and verb: does the operator crowd the user out?"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from bench.operator import NODE_PODS, _wait_all_ready, _yaml

FILES = 5  # the user's N models in 5 files, applied one after another (the measurement)
TARGET_RATIO = 2.0
TARGET_READY_S = 120.0


def by_agent_and_verb(requests: Iterable[Any]) -> dict[str, int]:
    """Requests counted by the user agent's program name (before the first '/') and verb, most first."""
    counts = collections.Counter(f"{r.user_agent.split('/', 1)[0] or '-'} {r.verb}" for r in requests)
    return dict(counts.most_common())


def timed_apply(kube: Any, documents: Sequence[dict[str, Any]]) -> float:
    """Seconds for `kubectl apply` of the documents in FILES files, one after another."""
    chunk = -(-len(documents) // FILES)
    started = time.monotonic()
    for start in range(0, len(documents), chunk):
        kube.run("apply", "-f", "-", stdin="\n---\n".join(_yaml(d) for d in documents[start : start + chunk]),
                 timeout=900)  # fmt: skip
    return time.monotonic() - started


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.burst", description=__doc__)
    parser.add_argument("--models", type=int, default=1000, help="InferenceModels the user applies (default 1000)")
    parser.add_argument("--timeout-s", type=float, default=900, help="give up waiting for Ready after this long")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.models < FILES:
        print(f"--models must be at least {FILES}", file=sys.stderr)
        return 2
    # Imported here: the pure helpers above need no control plane.
    from devtools.cluster import cluster, eventually, local_control_plane, node_manifest, node_ready
    from devtools.install import create_model_claims, install_crd
    from devtools.models import small_model
    from e2e.faults import AuditLog, count_by_verb_and_resource
    from e2e.harness import OperatorProcess

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
        for namespace in ("burst-alone", "burst-operator"):
            kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
            eventually(lambda n=namespace: kube.get_or_none("serviceaccount", "default", n), timeout=60, what="sa")
            create_model_claims(kube, namespace, ["models"])
        names = [f"m{i:05d}" for i in range(args.models)]
        alone_mark = audit.mark()
        alone_s = timed_apply(kube, [small_model("burst-alone", n) for n in names])
        alone = audit.requests(alone_mark)
        print(f"no operator: kubectl apply of {args.models} models in {alone_s:.1f} s", flush=True)

        operator = OperatorProcess(kube, "burst-operator", Path(scratch) / "operator.log", ["--resync-seconds", "60"])
        operator.start()
        try:
            time.sleep(2)  # kopf's initial lists and watches
            busy_mark = audit.mark()
            started = datetime.datetime.now(datetime.UTC)
            busy_s = timed_apply(kube, [small_model("burst-operator", n) for n in names])
            print(f"operator running: kubectl apply of {args.models} models in {busy_s:.1f} s", flush=True)
            ready_at = _wait_all_ready(kube, "burst-operator", args.models, started, args.timeout_s)
            busy = audit.requests(busy_mark)
        finally:
            operator.stop()
    ready_s = (ready_at - started).total_seconds() if ready_at else None
    ratio = busy_s / alone_s
    report = {
        "models": args.models,
        "apf_flow_schemas": len(flow_schemas),
        "apply_alone_s": round(alone_s, 1),
        "apply_with_operator_s": round(busy_s, 1),
        "ratio": f"{ratio:.2f}x (target <= {TARGET_RATIO}x: {'met' if ratio <= TARGET_RATIO else 'missed'})",
        "all_ready_s": f"{ready_s and round(ready_s, 1)} (target < {TARGET_READY_S:.0f} s: "
        f"{'met' if ready_s is not None and ready_s < TARGET_READY_S else 'missed'})",
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


if __name__ == "__main__":
    raise SystemExit(main())
