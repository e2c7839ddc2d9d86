"""Which GPU each worker process sees: the pod's GPUs as CUDA_VISIBLE_DEVICES values, one per worker, and which
NVML devices the metrics report (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# NVIDIA_VISIBLE_DEVICES values that name no particular device (a CUDA base image's "all", a CPU-only "void", the
# device plugin's volume-mounts strategy, which sets a path): the pod's GPUs then come from --gpus alone.
_UNLISTED = ("", "all", "none", "void")
_UUID_PREFIXES = ("GPU-", "MIG-")


def pod_gpus(nvidia_visible_devices: str | None, count: int) -> tuple[str, ...]:
    """The pod's GPUs as CUDA_VISIBLE_DEVICES values.

    The NVIDIA device plugin lists a container's GPUs in NVIDIA_VISIBLE_DEVICES, by UUID (`GPU-...`, `MIG-...`)
    or by the node's index. Inside the container the devices are renumbered from 0, so an index becomes its
    position in the list; a UUID names the same device everywhere and is kept. `count` (--gpus, the pod's
    nvidia.com/gpu limit) takes the first `count` listed devices, or devices 0..count-1 when none are listed;
    0 means every listed device. ValueError when `count` asks for more devices than are listed.
    """
    text = (nvidia_visible_devices or "").strip()
    listed = [] if text.lower() in _UNLISTED or "/" in text else [d.strip() for d in text.split(",") if d.strip()]
    devices = tuple(d if d.startswith(_UUID_PREFIXES) else str(i) for i, d in enumerate(listed))
    if not devices:
        return tuple(str(i) for i in range(count))
    if count > len(devices):
        raise ValueError(
            f"--gpus {count} but NVIDIA_VISIBLE_DEVICES lists {len(devices)} device(s) ({text}); "
            "lower --gpus (SKIFF_GPUS) to the pod's nvidia.com/gpu limit"
        )
    return devices[:count] if count else devices


def worker_devices(gpus: Sequence[str], workers: int) -> tuple[str, ...]:
    """Worker i's CUDA_VISIBLE_DEVICES: the pod's GPUs in turn (one worker per GPU when workers == len(gpus))."""
    if not gpus:
        return ()
    return tuple(gpus[i % len(gpus)] for i in range(workers))


@dataclass(frozen=True)
class NvmlDevice:
    """One GPU as NVML enumerates it inside the container: its index there and its UUID."""

    index: int
    uuid: str


def visible_gpus(devices: Sequence[NvmlDevice], env: Mapping[str, str]) -> tuple[NvmlDevice, ...]:
    """The GPUs this process may use, of those NVML lists (NVML itself ignores CUDA_VISIBLE_DEVICES).

    CUDA_VISIBLE_DEVICES, when set, names them by NVML index or UUID (a UUID prefix, as CUDA accepts), in its
    order, up to the first entry that names none (CUDA's rule; empty means none). Else NVIDIA_VISIBLE_DEVICES: UUIDs
    keep those devices; node indices, `all` or nothing keep every device NVML lists (the container runtime mounts
    only the pod's); `void`/`none` keep none.
    """
    cuda = env.get("CUDA_VISIBLE_DEVICES")
    if cuda is not None:
        chosen: list[NvmlDevice] = []
        for entry in (e.strip() for e in cuda.split(",")):
            match = _device_named(devices, entry)
            if match is None:
                break
            if match not in chosen:
                chosen.append(match)
        return tuple(chosen)
    text = (env.get("NVIDIA_VISIBLE_DEVICES") or "").strip()
    if text.lower() in ("void", "none"):
        return ()
    listed = [d.strip() for d in text.split(",") if d.strip()]
    uuids = [d for d in listed if d.startswith(_UUID_PREFIXES)]
    if uuids and "/" not in text:
        return tuple(d for d in devices if d.uuid in uuids)
    return tuple(devices)


def _device_named(devices: Sequence[NvmlDevice], entry: str) -> NvmlDevice | None:
    if entry.isdigit():
        return next((d for d in devices if d.index == int(entry)), None)
    if entry.startswith(_UUID_PREFIXES):
        found = [d for d in devices if d.uuid.startswith(entry)]
        return found[0] if len(found) == 1 else None
    return None
