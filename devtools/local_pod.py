"""A Deployment's runtime container run here as a process, as the kubelet would run it (the pod contract)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devtools.cluster import free_port


@dataclass(frozen=True)
class LocalPod:
    """A pod's runtime container translated to a local process: what to run, with which env, on which ports.

    The translation is mechanical, and the same for every field:
    - argv is the container's command + args; a bare `skiff-runtime` becomes this venv's skiff-runtime.
    - Volumes become directories: a PersistentVolumeClaim its root in `claim_roots` (then `subPath` is applied,
      as the kubelet does), an emptyDir a fresh directory, a Secret a fresh directory holding one file per key
      of that Secret's data in `secrets` (as the kubelet projects it, honouring `items`). Env values that are a
      mount path, or under one, are rewritten to the local directory.
    - A pod has its own network namespace; this process does not. Each containerPort is mapped to a free
      local port, and env vars named *_PORT whose value is a containerPort get the mapped port. Probes are
      sent to the mapped port of the probe's `port`.
    Nothing else changes: no flag is added and no variable is invented.
    """

    argv: tuple[str, ...]
    env: dict[str, str]
    ports: dict[int, int]  # containerPort -> local port
    mounts: dict[str, Path]  # mountPath -> local directory
    container: dict[str, Any]

    def probe_target(self, probe: str) -> tuple[str, str]:
        """(host:port, service) the kubelet's grpc probe of this kind would check."""
        grpc = self.container[probe]["grpc"]
        return f"127.0.0.1:{self.ports[grpc['port']]}", str(grpc.get("service", ""))

    def port_of(self, name: str) -> int:
        declared = next(p for p in self.container["ports"] if p["name"] == name)
        return self.ports[declared["containerPort"]]


def local_pod(
    deployment: dict[str, Any],
    *,
    claim_roots: dict[str, Path],
    scratch: Path,
    container_name: str = "runtime",
    secrets: Mapping[str, Mapping[str, bytes]] | None = None,
) -> LocalPod:
    pod_spec = deployment["spec"]["template"]["spec"]
    container = next(c for c in pod_spec["containers"] if c["name"] == container_name)
    volumes: dict[str, Path] = {}
    for volume in pod_spec.get("volumes", []):
        if "persistentVolumeClaim" in volume:
            volumes[volume["name"]] = claim_roots[volume["persistentVolumeClaim"]["claimName"]]
        elif "emptyDir" in volume:
            volumes[volume["name"]] = scratch / "volumes" / volume["name"]
            volumes[volume["name"]].mkdir(parents=True)
        elif "secret" in volume:
            volumes[volume["name"]] = project_secret(volume, secrets or {}, scratch / "volumes" / volume["name"])
        else:
            raise ValueError(f"volume {volume['name']}: only persistentVolumeClaim, emptyDir and secret can be mapped")
    mounts = {m["mountPath"]: volumes[m["name"]] / m.get("subPath", "") for m in container.get("volumeMounts", [])}
    ports = {p["containerPort"]: free_port() for p in container.get("ports", [])}

    def local_value(name: str, value: str) -> str:
        if name.endswith("_PORT") and value.isdigit():
            if int(value) not in ports:
                raise AssertionError(f"{name}={value} is not one of the container's ports {sorted(ports)}")
            return str(ports[int(value)])
        for mount_path, directory in sorted(mounts.items(), key=lambda item: -len(item[0])):
            if value == mount_path or value.startswith(mount_path.rstrip("/") + "/"):
                return str(directory / value[len(mount_path) :].lstrip("/"))
        return value

    env: dict[str, str] = {}
    for variable in container.get("env", []):
        if "value" not in variable:
            raise ValueError(f"env {variable['name']}: only literal values can be mapped")
        env[variable["name"]] = local_value(variable["name"], variable["value"])
    argv = [*container.get("command", []), *container.get("args", [])]
    if not argv:
        raise ValueError("the container has no command: the image's entrypoint cannot be reproduced locally")
    if "/" not in argv[0]:
        argv[0] = str(Path(sys.executable).parent / argv[0])
    return LocalPod(tuple(argv), env, ports, mounts, container)


def project_secret(volume: Mapping[str, Any], secrets: Mapping[str, Mapping[str, bytes]], directory: Path) -> Path:
    """A secret volume as the kubelet writes it: one file per key (or per `items` entry), owner-readable only."""
    source = volume["secret"]
    data = secrets.get(source["secretName"])
    if data is None:
        raise ValueError(f"volume {volume['name']}: Secret {source['secretName']!r} was not given to local_pod")
    items = source.get("items") or [{"key": key, "path": key} for key in data]
    directory.mkdir(parents=True)
    for item in items:
        target = directory / item["path"]
        target.write_bytes(data[item["key"]])
        target.chmod(0o400)
    return directory


def start_local_pod(pod: LocalPod, scratch: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """Runs the container's process with the pod's env plus PATH and HOME (the image would provide both)."""
    home = pod.mounts.get("/tmp", scratch)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), **pod.env}
    with log_path.open("wb") as log:
        return subprocess.Popen(pod.argv, env=env, cwd=scratch, stdout=log, stderr=subprocess.STDOUT)


def stop_local_pod(process: subprocess.Popen[bytes], log_path: Path, timeout_s: float = 60) -> int:
    """SIGTERM, as the kubelet sends; prints the end of the runtime's log; returns the exit code."""
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    finally:
        print(log_path.read_text(errors="replace")[-5000:])


def grpc_health_check(target: str, service: str, timeout_s: float) -> str:
    """One kubelet-style gRPC probe: grpc.health.v1 Check(service) with the probe's timeout, plaintext.

    Returns the status name (SERVING passes), or the gRPC error code's name when the call fails."""
    with grpc.insecure_channel(target) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
            )
        except grpc.RpcError as error:
            return str(error.code().name)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


def wait_for_startup_probe(pod: LocalPod, process: subprocess.Popen[bytes], *, poll_s: float = 0.5) -> float:
    """Seconds until the startup probe passes. The kubelet checks every periodSeconds and gives up after
    failureThreshold failures; this checks every `poll_s` (faster) within the same total budget."""
    probe = pod.container["startupProbe"]
    budget = probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)
    target, service = pod.probe_target("startupProbe")
    started = time.monotonic()
    status = "never checked"
    while time.monotonic() - started < budget:
        if process.poll() is not None:
            raise RuntimeError(f"the runtime exited with {process.returncode} before its startup probe passed")
        status = grpc_health_check(target, service, probe.get("timeoutSeconds", 1))
        if status == "SERVING":
            return time.monotonic() - started
        time.sleep(poll_s)
    raise TimeoutError(f"startup probe {target} service={service!r} still {status} after {budget}s")
