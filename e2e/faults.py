"""Fault injection and request accounting for the e2e fault tests: the API server's audit log read back per
client, and an admission webhook that answers the operator's Deployment writes with the failure a test picks."""

from __future__ import annotations

import base64
import collections
import datetime
import http.server
import json
import ssl
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.cluster import Kubectl
from devtools.storage import serving_certificate

# The operator's two HTTP clients: kopf's own (watches, its annotations, events) and kubernetes_asyncio's (kube.py).
OPERATOR_USER_AGENTS = ("kopf/", "skiff-operator/", "OpenAPI-Generator/")
OPERATOR_FIELD_MANAGER = "skiff-operator"


# -- the audit log ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One request the API server logged (the first audit stage it wrote for it)."""

    received: datetime.datetime
    user_agent: str
    verb: str  # get, list, watch, create, update, patch, delete, ...
    resource: str  # "deployments", "inferencemodels/status", or the path of a non-resource request
    namespace: str
    name: str
    code: int

    @property
    def from_operator(self) -> bool:
        return self.user_agent.startswith(OPERATOR_USER_AGENTS)


class AuditLog:
    """The local control plane's audit log (policy in devtools/cluster.py: every request but leases, Metadata level)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def mark(self) -> int:
        """A position to read from later: only requests logged after it."""
        return self.path.stat().st_size

    def requests(self, since: int = 0) -> list[Request]:
        with self.path.open("rb") as log:
            log.seek(since)
            lines = log.read().split(b"\n")[:-1]  # the last piece may be a line still being written
        seen: set[str] = set()
        found = []
        for line in lines:
            entry = json.loads(line)
            if entry["auditID"] in seen:  # a watch logs ResponseStarted, then ResponseComplete when it ends
                continue
            seen.add(entry["auditID"])
            ref = entry.get("objectRef") or {}
            resource = "/".join(filter(None, (ref.get("resource"), ref.get("subresource")))) or entry["requestURI"]
            found.append(
                Request(
                    received=datetime.datetime.fromisoformat(entry["requestReceivedTimestamp"]),
                    user_agent=entry.get("userAgent", ""),
                    verb=entry["verb"],
                    resource=resource,
                    namespace=ref.get("namespace", ""),
                    name=ref.get("name", ""),
                    code=int((entry.get("responseStatus") or {}).get("code", 0)),
                )
            )
        return found


def count_by_verb(requests: Iterable[Request]) -> dict[str, int]:
    return dict(sorted(collections.Counter(r.verb for r in requests).items()))


def count_by_verb_and_resource(requests: Iterable[Request]) -> dict[tuple[str, str], int]:
    return dict(sorted(collections.Counter((r.verb, r.resource) for r in requests).items()))


# -- an admission webhook that fails the operator's writes ------------------------------------------------------


@dataclass(frozen=True)
class WebhookCall:
    at: float  # time.monotonic()
    operation: str  # CREATE or UPDATE
    name: str
    answer: str  # the mode it was answered in


@dataclass
class AdmissionFaults:
    """A validating admission webhook on 127.0.0.1 (HTTPS with its own CA) that the API server calls for every
    create and update of a Deployment in one namespace. Writes by the operator's field manager are answered
    according to `mode`; everyone else's are allowed.

    - "allow": admitted.
    - "conflict": denied with HTTP 409 Conflict, which the API server passes on to the operator as is.
    - "timeout": not answered within the webhook's timeoutSeconds (1 s); the API server fails the write
      (failurePolicy Fail) with an error after waiting for it.
    """

    kube: Kubectl
    namespace: str
    mode: str = "allow"
    calls: list[WebhookCall] = field(default_factory=list)
    _server: http.server.ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        return f"faults-{self.namespace}"[:63]

    def operator_calls(self, answer: str | None = None) -> list[WebhookCall]:
        with self._lock:
            return [c for c in self.calls if answer is None or c.answer == answer]

    def _answer(self, review: dict[str, Any]) -> dict[str, Any]:
        request = review["request"]
        response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
        if (request.get("options") or {}).get("fieldManager") != OPERATOR_FIELD_MANAGER:
            return response
        mode = self.mode
        with self._lock:
            self.calls.append(WebhookCall(time.monotonic(), request["operation"], request["name"], mode))
        if mode == "conflict":
            response["allowed"] = False
            response["status"] = {"code": 409, "reason": "Conflict", "message": "injected conflict (e2e faults)"}
        elif mode == "timeout":
            time.sleep(3)  # past timeoutSeconds: the API server has already given up on this answer
        return response

    def __enter__(self) -> AdmissionFaults:
        ca_pem, cert_pem, key_pem = serving_certificate("127.0.0.1")
        faults = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                body = json.dumps(
                    {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": faults._answer(review)}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with tempfile.TemporaryDirectory() as scratch:
            (Path(scratch) / "cert.pem").write_bytes(cert_pem)
            (Path(scratch) / "key.pem").write_bytes(key_pem)
            context.load_cert_chain(Path(scratch) / "cert.pem", Path(scratch) / "key.pem")
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        server.socket = context.wrap_socket(server.socket, server_side=True)
        self._server = server
        threading.Thread(target=server.serve_forever, name="admission-faults", daemon=True).start()
        port = server.server_address[1]
        self.kube.apply(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": self.name},
                "webhooks": [
                    {
                        "name": "faults.e2e.skiff.dev",
                        "clientConfig": {
                            "url": f"https://127.0.0.1:{port}/validate",
                            "caBundle": base64.b64encode(ca_pem).decode(),
                        },
                        "rules": [
                            {
                                "apiGroups": ["apps"],
                                "apiVersions": ["v1"],
                                "operations": ["CREATE", "UPDATE"],
                                "resources": ["deployments"],
                                "scope": "Namespaced",
                            }
                        ],
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.namespace}},
                        "failurePolicy": "Fail",
                        "sideEffects": "None",
                        "admissionReviewVersions": ["v1"],
                        "timeoutSeconds": 1,
                    }
                ],
            }
        )
        return self

    def __exit__(self, *_: object) -> None:
        self.kube.run("delete", "validatingwebhookconfiguration", self.name, "--ignore-not-found")
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def secret_values(kube: Kubectl, namespace: str) -> Iterator[tuple[str, bytes]]:
    """("secret/key", value) for every data item of every Secret in the namespace, decoded."""
    for secret in kube.items("secrets", namespace):
        for key, encoded in (secret.get("data") or {}).items():
            yield f"{secret['metadata']['name']}/{key}", base64.b64decode(encoded)
