"""The container images as tests use them: built by scripts/images.sh, run with podman, a pod spec turned into flags."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from devtools.cluster import REPO

SCRIPT = REPO / "scripts" / "images.sh"
# What scripts/images.sh needs, plus slirp4netns: the runtime container gets its own network namespace.
TOOLS = ("buildah", "podman", "skopeo", "mmdebstrap", "runc", "slirp4netns")
INSTALL_HINT = f"apt-get install -y {' '.join(TOOLS)}  (Debian/Ubuntu, as root; then: make images)"
# The budgets docs/images.md reports: the Paddle CPU runtime (paddle alone is ~720 MiB; the ocr extra's OpenCV
# headless and pyclipper add ~190 MB) and the operator.
SIZE_BUDGETS = {"runtime": 1_300_000_000, "operator": 300_000_000}
# The first line of the CA bundle scripts/images.sh mounts for the build steps; no image may contain it.
BUILD_CA_MARKER = "# skiff-build-ca:"


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def images_required() -> bool:
    """SKIFF_IMAGES_REQUIRED=1 or SKIFF_E2E_REQUIRED=1 (CI): missing tools fail the image tests instead of skipping."""
    return "1" in (os.environ.get("SKIFF_IMAGES_REQUIRED"), os.environ.get("SKIFF_E2E_REQUIRED"))


def build_images() -> None:
    """`scripts/images.sh build` with its progress on this process's stdout: minutes cold, under a second cached."""
    subprocess.run(["bash", str(SCRIPT), "build"], check=True)


@dataclass(frozen=True)
class Images:
    """Where scripts/images.sh keeps the images (`images.sh env`), and podman pointed at that storage. `runtime` and
    `operator` are the tags of this checkout's inputs (`localhost/skiff-runtime:<version>-<inputs hash>`), their
    archives `runtime_archive` and `operator_archive`: another checkout's build never replaces them."""

    storage_root: Path
    run_root: Path
    containers_conf: Path
    archives: Path
    runtime: str
    operator: str
    runtime_archive: Path
    operator_archive: Path

    @classmethod
    def from_script(cls) -> Images:
        out = subprocess.run(["bash", str(SCRIPT), "env"], capture_output=True, text=True, check=True).stdout
        values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        return cls(
            Path(values["STORAGE_ROOT"]),
            Path(values["RUN_ROOT"]),
            Path(values["CONTAINERS_CONF"]),
            Path(values["ARCHIVES"]),
            values["RUNTIME_IMAGE"],
            values["OPERATOR_IMAGE"],
            Path(values["RUNTIME_ARCHIVE"]),
            Path(values["OPERATOR_ARCHIVE"]),
        )

    def archive(self, image: str) -> Path:
        """The OCI archive of "runtime" or "operator" built from this checkout's inputs."""
        return {"runtime": self.runtime_archive, "operator": self.operator_archive}[image]

    def podman_argv(self, *args: str) -> list[str]:
        return ["podman", "--root", str(self.storage_root), "--runroot", str(self.run_root), "--storage-driver",
                "overlay", *args]  # fmt: skip

    def podman(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """podman ARGS with the cache's storage and containers.conf (runc, rlimits), never /etc's."""
        return subprocess.run(
            self.podman_argv(*args),
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
            env={**os.environ, "CONTAINERS_CONF": str(self.containers_conf)},
        )

    def inspect(self, image: str) -> dict[str, Any]:
        found: list[dict[str, Any]] = json.loads(self.podman("image", "inspect", image).stdout)
        return found[0]


def pod_run_flags(
    pod_spec: Mapping[str, Any],
    *,
    claim_roots: Mapping[str, Path] | None = None,
    published: Mapping[int, int] | None = None,
    fields: Mapping[str, str] | None = None,
) -> list[str]:
    """`podman run` flags for a pod's only container, mechanically:
    - the pod's runAsUser/runAsGroup -> --user; readOnlyRootFilesystem -> --read-only; allowPrivilegeEscalation
      false -> no-new-privileges; capabilities.drop -> --cap-drop (seccomp RuntimeDefault is podman's default);
    - an emptyDir -> a tmpfs at its mountPath (writable, exec, like the kubelet's directory); a
      PersistentVolumeClaim -> its root in `claim_roots` (plus subPath), bind-mounted read-only when the mount is;
    - env -> -e, unchanged (a fieldRef from `fields`); command -> --entrypoint (the image's PATH finds it), args
      follow the image;
    - each containerPort -> published on 127.0.0.1 at `published[port]`, in podman's own network namespace; with
      `published` None, the host's network (the container then reaches a control plane on 127.0.0.1).
    Anything else (Secrets, other volume kinds) raises: this test does not pretend to map it."""
    (container,) = pod_spec["containers"]
    pod_security = pod_spec.get("securityContext", {})
    security = container.get("securityContext", {})
    flags = ["--user", f"{pod_security['runAsUser']}:{pod_security.get('runAsGroup', pod_security['runAsUser'])}"]
    if security.get("readOnlyRootFilesystem"):
        flags.append("--read-only")
    if security.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    for capability in security.get("capabilities", {}).get("drop", []):
        flags += ["--cap-drop", capability]
    volumes = {volume["name"]: volume for volume in pod_spec.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "emptyDir" in volume:
            flags += ["--tmpfs", f"{mount['mountPath']}:rw,exec,mode=1777"]
        elif "persistentVolumeClaim" in volume:
            source = (claim_roots or {})[volume["persistentVolumeClaim"]["claimName"]] / mount.get("subPath", "")
            flags += ["--volume", f"{source}:{mount['mountPath']}:{'ro' if mount.get('readOnly') else 'rw'}"]
        else:
            raise ValueError(f"volume {mount['name']}: only emptyDir and persistentVolumeClaim are mapped here")
    for variable in container.get("env", []):
        # The downward API (valueFrom.fieldRef) from `fields` (fieldPath -> value), as the kubelet fills it in.
        field = variable.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        value = variable["value"] if field is None else (fields or {})[field]
        flags += ["--env", f"{variable['name']}={value}"]
    if published is None:
        flags += ["--network", "host"]
    else:
        flags += ["--network", "slirp4netns"]
        for port in container.get("ports", []):
            flags += ["--publish", f"127.0.0.1:{published[port['containerPort']]}:{port['containerPort']}"]
    command: Sequence[str] = container.get("command", [])
    if command:
        flags += ["--entrypoint", json.dumps(list(command))]
    return flags


def layers_containing(archive: Path, needle: bytes) -> list[str]:
    """The digests of the layers in an OCI archive (`images.sh` writes one per image) whose bytes contain needle:
    every layer, not just the files the merged image shows."""
    found = []
    with tarfile.open(archive) as outer:

        def read(name: str) -> IO[bytes]:
            member = outer.extractfile(name)
            assert member is not None, f"{archive} lacks {name}"
            return member

        def blob(digest: str) -> IO[bytes]:
            return read("blobs/" + digest.replace(":", "/"))

        (entry,) = json.load(read("index.json"))["manifests"]
        for layer in json.load(blob(entry["digest"]))["layers"]:
            compressed = layer["mediaType"].endswith("gzip")
            with gzip.open(blob(layer["digest"])) if compressed else blob(layer["digest"]) as stream:
                tail = b""
                while chunk := stream.read(1 << 20):
                    if needle in tail + chunk:
                        found.append(layer["digest"])
                        break
                    tail = chunk[-len(needle) :]
    return found
