"""The third-party data files tests use, committed under third_party/ with their licenses and pinned by sha256."""

from __future__ import annotations

import hashlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
THIRD_PARTY = REPO / "third_party"
# Standard channel, config/crd/standard/ of the Go module sigs.k8s.io/gateway-api@v1.6.1 (go.sum
# h1:mock6phZbI6rvZerwrVNk7hVNymQgHo+6sJ81Ia7ftY=): the CRDs a GRPCRoute and its parent Gateway need.
GATEWAY_API_DIR = THIRD_PARTY / "gateway-api-v1.6.1"
# skaffold's published JSON schema for skaffold.yaml apiVersion skaffold/v4beta14.
SKAFFOLD_SCHEMA = THIRD_PARTY / "skaffold-schema-v4beta14" / "v4beta14.json"

SHA256 = {
    "gateway-api-v1.6.1/LICENSE": "20b6dde626f521dbb384f75e6d96c3d16789df3bf878b58bc2810614fb4db07c",
    "gateway-api-v1.6.1/gateway.networking.k8s.io_gatewayclasses.yaml": (
        "53710048ba26f8620eed59d5e51b157ecf040daf5c6eef31a4b991e0808c4be5"
    ),
    "gateway-api-v1.6.1/gateway.networking.k8s.io_gateways.yaml": (
        "25b885f5870b8fff1ae82efa2628b2761cef3745900c2aecf8fb76629a01255a"
    ),
    "gateway-api-v1.6.1/gateway.networking.k8s.io_grpcroutes.yaml": (
        "53a8d029da8f07e55d3fa58a5cf6de5950dab19fbb8d6a8082fb5e51ca5ef6fc"
    ),
    "gateway-api-v1.6.1/gateway.networking.k8s.io_referencegrants.yaml": (
        "8c645e9333cfa67790cc2a53e0c00076f88b2bd4230d2b49688c78bc34f9b2c3"
    ),
    # Traefik (devtools/gateway.py) waits for these three too before it writes any status.
    "gateway-api-v1.6.1/gateway.networking.k8s.io_httproutes.yaml": (
        "a424a0d6c953b162e71d1d97bb7e75012d8f1ac264e7274f2763d1b96ab39852"
    ),
    "gateway-api-v1.6.1/gateway.networking.k8s.io_backendtlspolicies.yaml": (
        "0d48c9e4b53dd9510cf615b9b1192d9d7afb07a1cc0498c9515627cb1c075419"
    ),
    "gateway-api-v1.6.1/gateway.networking.k8s.io_tlsroutes.yaml": (
        "bb8b67926e5d9652cbfd2e19063b7c1d9e78806c9dd671608f57baef2f2e3bbb"
    ),
    "skaffold-schema-v4beta14/LICENSE": "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30",
    "skaffold-schema-v4beta14/v4beta14.json": "7c29a621995d2c6143d3c423c8e3d3dfb25703a49fd1cf77644b54168414b39e",
}


def gateway_api_crd(plural: str) -> Path:
    """The standard-channel v1.6.1 CRD file for `plural` (e.g. "grpcroutes")."""
    return GATEWAY_API_DIR / f"gateway.networking.k8s.io_{plural}.yaml"


def mismatched_files() -> list[str]:
    """The pinned files under third_party/ that are missing or whose sha256 differs (empty when all match)."""
    bad = []
    for name, digest in SHA256.items():
        path = THIRD_PARTY / name
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            bad.append(name)
    return bad
