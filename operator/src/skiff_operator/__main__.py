"""Command line: `skiff-operator run` (or `python -m skiff_operator`) starts the operator under kopf."""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import kopf

from skiff_operator.controller import OperatorOptions
from skiff_operator.handlers import build_registry
from skiff_operator.leader import LeaseOptions, default_identity
from skiff_operator.spec import DEFAULT_IMAGE, OperatorDefaults, SpecError, parse_spread_domains

MAX_IMAGE_LENGTH = 512  # the CRD's maxLength of spec.runtime.image

_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class RunConfig:
    namespaces: tuple[str, ...]
    clusterwide: bool
    liveness_endpoint: str | None
    standalone: bool
    peering_name: str | None
    log_level: str
    options: OperatorOptions


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="skiff-operator", description="Runs the Skiff operator, which serves InferenceModels."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="watch InferenceModels and reconcile them")
    scope = run.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        metavar="NS",
        help="watch this namespace (repeatable); default from $SKIFF_OPERATOR_NAMESPACES (comma-separated)",
    )
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace")
    run.add_argument(
        "--liveness",
        metavar="URL",
        default=os.environ.get("SKIFF_OPERATOR_LIVENESS"),
        help="serve kopf's liveness probe here, e.g. http://0.0.0.0:8080/healthz",
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve the operator's Prometheus metrics on http://0.0.0.0:PORT/metrics (default: not served; the "
        "chart passes 8081)",
    )
    run.add_argument("--standalone", action="store_true", help="skip kopf's peering (leader election is separate)")
    run.add_argument(
        "--leader-elect",
        action="store_true",
        help="run as one of several replicas: only the holder of a coordination.k8s.io Lease reconciles",
    )
    run.add_argument(
        "--lease-name", default="skiff-operator", help="the Lease replicas elect a leader on (default %(default)s)"
    )
    run.add_argument(
        "--lease-namespace",
        default=os.environ.get("SKIFF_OPERATOR_POD_NAMESPACE"),
        help="the Lease's namespace (default $SKIFF_OPERATOR_POD_NAMESPACE, the chart sets it to the pod's)",
    )
    run.add_argument(
        "--workers",
        type=int,
        default=OperatorOptions.workers,
        help="reconciles running at once, over all models (default %(default)s)",
    )
    run.add_argument("--peering", metavar="NAME", help="the KopfPeering object shared by replicas")
    run.add_argument(
        "--resync-seconds",
        type=float,
        default=OperatorOptions.resync_interval_s,
        help="reconcile every model this often even without changes (default %(default)s)",
    )
    run.add_argument(
        "--watch-timeout-seconds",
        type=int,
        default=OperatorOptions.watch_server_timeout_s,
        help="how long the API server keeps one watch open (default %(default)s)",
    )
    run.add_argument(
        "--route-settle-seconds",
        type=float,
        default=OperatorOptions.route_settle_s,
        help="Gateway mode: Ready this long after every gateway accepted the route's current generation, for the "
        "gateway's data plane to follow (default %(default)s)",
    )
    run.add_argument(
        "--default-runtime-image",
        default=os.environ.get("SKIFF_OPERATOR_DEFAULT_RUNTIME_IMAGE", DEFAULT_IMAGE),
        metavar="IMAGE",
        help="the runtime image of a model whose spec.runtime.image is unset (the chart passes its runtimeImage; "
        "default %(default)s)",
    )
    run.add_argument(
        "--default-spread-across",
        default="",
        metavar="DOMAINS",
        help="spread every version's pods across Nodes, Zones or Nodes,Zones where a model sets neither "
        "spec.podTemplate.spreadAcross nor topologySpreadConstraints (default: no spread)",
    )
    run.add_argument(
        "--log-level",
        default=os.environ.get("SKIFF_OPERATOR_LOG_LEVEL", "INFO"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
    )
    return parser


def parse_run_config(argv: Sequence[str]) -> RunConfig:
    """`run` is the default command, so `python -m skiff_operator --namespace ml` works too."""
    args_list = list(argv)
    if not args_list or (args_list[0].startswith("-") and args_list[0] not in ("-h", "--help")):
        args_list.insert(0, "run")
    parser = build_parser()
    args = parser.parse_args(args_list)
    namespaces = tuple(args.namespace) or tuple(
        ns for ns in os.environ.get("SKIFF_OPERATOR_NAMESPACES", "").split(",") if ns.strip()
    )
    if not namespaces and not args.all_namespaces:
        parser.error("choose the scope: --namespace NS (repeatable) or --all-namespaces")
    if args.workers < 1:
        parser.error(f"--workers {args.workers}: give at least 1")
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        parser.error(f"--metrics-port {args.metrics_port}: give a port number 0-65535")
    if not 0 <= args.route_settle_seconds <= 300:
        parser.error(f"--route-settle-seconds {args.route_settle_seconds:g}: give 0 to 300")
    try:
        spread = parse_spread_domains(
            [d.strip() for d in args.default_spread_across.split(",") if d.strip()], "--default-spread-across"
        )
    except SpecError as error:
        parser.error(error.message)
    image = args.default_runtime_image.strip()
    if not image or len(image) > MAX_IMAGE_LENGTH or any(c.isspace() for c in image):
        parser.error(f"--default-runtime-image {image!r}: give an image reference such as host/ns/skiff-runtime:0.1.0")
    lease = None
    if args.leader_elect:
        if not args.lease_namespace or not _NAMESPACE.match(args.lease_namespace):
            parser.error("--leader-elect needs --lease-namespace NS (or $SKIFF_OPERATOR_POD_NAMESPACE)")
        lease = LeaseOptions(args.lease_name, args.lease_namespace, default_identity())
    for namespace in namespaces:
        if not _NAMESPACE.match(namespace.strip()):
            parser.error(
                f"--namespace {namespace!r}: give a namespace name (patterns are not supported: Pods are watched "
                "per named namespace, filtered by the API server)"
            )
    return RunConfig(
        namespaces=tuple(ns.strip() for ns in namespaces),
        clusterwide=bool(args.all_namespaces),
        liveness_endpoint=args.liveness,
        standalone=bool(args.standalone),
        peering_name=args.peering,
        log_level=args.log_level,
        options=OperatorOptions(
            resync_interval_s=args.resync_seconds,
            watch_server_timeout_s=args.watch_timeout_seconds,
            workers=args.workers,
            route_settle_s=args.route_settle_seconds,
            lease=lease,
            namespaces=() if args.all_namespaces else tuple(ns.strip() for ns in namespaces),
            defaults=OperatorDefaults(runtime_image=image, spread_across=spread),
            metrics_port=args.metrics_port,
        ),
    )


# The API client logs every response body at DEBUG, Secrets' data included (found by the e2e fault tests with
# --log-level DEBUG: the TLS private keys were in the log). Its DEBUG output never reaches the operator's log.
SILENCED_BELOW_INFO = ("kubernetes_asyncio.client.rest",)
# kopf logs every handled watch event at INFO ("Handler 'model' succeeded"): with 1,000 models, thousands of
# lines a minute that say nothing. Its warnings and errors still show; at DEBUG, everything does.
QUIET_BELOW_WARNING = ("kopf.objects",)


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in SILENCED_BELOW_INFO:
        logging.getLogger(name).setLevel(max(logging.INFO, logging.getLevelName(level)))
    if level != "DEBUG":
        for name in QUIET_BELOW_WARNING:
            logging.getLogger(name).setLevel(logging.WARNING)


# The deepest JSON the API server decodes (Go's encoding/json stops at 10,000 levels). Client-written
# metadata.managedFields are stored as sent, however deep (measured: 1,500 levels accepted by v1.36), and kopf
# decodes every watch event with json.loads, which recurses under Python's recursion limit (1,000 by default): one
# such object raised RecursionError in kopf's watcher and ended the operator, freezing every model (measured in
# e2e/test_hostile_bodies.py without this). The limit covers that depth with a frame or two per level to spare
# (kopf deep-copies a body), below the depth at which the C stack (8 MiB) would overflow (measured: over 30,000
# levels decode, copy, compare and encode).
API_SERVER_MAX_JSON_DEPTH = 10_000
RECURSION_LIMIT = 25_000


def allow_api_server_depth() -> None:
    """Lets every body the API server can send be decoded and copied (see RECURSION_LIMIT)."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), RECURSION_LIMIT))


def main(argv: Sequence[str] | None = None) -> int:
    run_config = parse_run_config(sys.argv[1:] if argv is None else argv)
    configure_logging(run_config.log_level)
    allow_api_server_depth()

    kopf.run(
        registry=build_registry(run_config.options),
        clusterwide=run_config.clusterwide,
        namespaces=run_config.namespaces,
        liveness_endpoint=run_config.liveness_endpoint,
        standalone=run_config.standalone,
        peering_name=run_config.peering_name,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
