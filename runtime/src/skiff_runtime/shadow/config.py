"""The shadow file a stable pod re-reads (the operator renders it into a ConfigMap the pod mounts): where copies go
(the candidate's address and version), which versions copy, the ratio, the queue and the comparison. Pure: bytes in,
a frozen ShadowConfig (or None: no shadowing) out, and a clear ValueError for a file that cannot be used."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skiff_runtime.shadow.compare import CompareMode, OutputRule, Rules

DEFAULT_TIMEOUT_S = 10.0
MAX_QUEUE_SIZE = 1024  # the operator's spec.shadow.MAX_QUEUE_SIZE


@dataclass(frozen=True)
class ShadowTLS:
    """The candidate serves TLS: verify it against `ca_file` (the model's CA bundle, mounted in every pod) for
    `server_name` (a name its certificate holds: the version Service's `<service>.<namespace>.svc`), whatever
    address the copies are sent to."""

    server_name: str
    ca_file: str


@dataclass(frozen=True)
class ShadowConfig:
    """Copy `ratio` of the requests answered by a version in `sources` to `target` (the candidate `candidate`),
    over TLS when `tls` is set."""

    candidate: str
    target: str  # host:port of the candidate's inference port
    sources: tuple[str, ...]  # the versions that copy (the stable ones); the candidate never copies
    ratio: float
    queue_size: int
    timeout_s: float
    rules: Rules
    tls: ShadowTLS | None = None

    def copies_from(self, version: str) -> bool:
        """Whether the runtime serving `version` makes copies under this config."""
        return version in self.sources and version != self.candidate


def parse_shadow_config(content: bytes) -> ShadowConfig | None:
    """The config a shadow file holds; None for an empty file or `{}` (shadowing off). ValueError, naming the
    field, for anything else that is not a usable config."""
    text = content.decode("utf-8", errors="replace").strip()
    if not text:
        return None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"{exc.msg} at line {exc.lineno}"
        raise ValueError(f"shadow file is not JSON ({where}); write {{}} to turn it off") from None
    if not isinstance(raw, Mapping):
        raise ValueError("shadow file must hold a JSON object ({} turns shadowing off)")
    if not raw:
        return None
    sources = raw.get("sources")
    if not isinstance(sources, list) or not all(isinstance(s, str) and s for s in sources):
        raise ValueError("shadow file: 'sources' must list the versions that copy, as strings")
    outputs: dict[str, OutputRule] = {}
    for entry in _list(raw.get("outputs", []), "outputs"):
        item = _object(entry, "outputs[]")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError("shadow file: each of 'outputs' needs a 'name'")
        outputs[name] = _rule(item, f"outputs[{name}]")
    return ShadowConfig(
        candidate=_text(raw.get("candidate"), "candidate"),
        target=_text(raw.get("target"), "target"),
        sources=tuple(sources),
        ratio=_number(raw.get("ratio", 0.1), "ratio", 0.0, 1.0, open_low=True),
        queue_size=int(_number(raw.get("queueSize", 64), "queueSize", 1, MAX_QUEUE_SIZE, integer=True)),
        timeout_s=_number(raw.get("timeoutSeconds", DEFAULT_TIMEOUT_S), "timeoutSeconds", 0.0, 600.0, open_low=True),
        rules=Rules(_rule(_object(raw.get("compare", {}), "compare"), "compare"), outputs),
        tls=_tls(raw["tls"]) if raw.get("tls") is not None else None,
    )


def _tls(value: Any) -> ShadowTLS:
    item = _object(value, "tls")
    return ShadowTLS(_text(item.get("serverName"), "tls.serverName"), _text(item.get("caFile"), "tls.caFile"))


def _rule(raw: Mapping[str, Any], where: str) -> OutputRule:
    mode = raw.get("mode", CompareMode.TOLERANCE.value)
    try:
        parsed = CompareMode(mode)
    except ValueError:
        modes = ", ".join(m.value for m in CompareMode)
        raise ValueError(f"shadow file: {where}.mode must be one of {modes} (not {mode!r})") from None
    return OutputRule(
        parsed,
        atol=_number(raw.get("atol", 1e-5), f"{where}.atol", 0.0, math.inf),
        rtol=_number(raw.get("rtol", 1e-4), f"{where}.rtol", 0.0, math.inf),
        top_k=int(_number(raw.get("topK", 1), f"{where}.topK", 1, 100, integer=True)),
    )


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"shadow file: '{where}' must be a non-empty string")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"shadow file: '{where}' must be a list")
    return value


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"shadow file: '{where}' must be an object")
    return value


def _number(value: Any, where: str, low: float, high: float, *, open_low: bool = False, integer: bool = False) -> float:
    kinds = int if integer else int | float
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value):
        raise ValueError(f"shadow file: '{where}' must be {'an integer' if integer else 'a number'}")
    if value < low or (open_low and value == low) or value > high:
        raise ValueError(f"shadow file: '{where}' must be {'above' if open_low else 'at least'} {low:g} and at most "
                         f"{high:g} (not {value!r})")  # fmt: skip
    return float(value)
