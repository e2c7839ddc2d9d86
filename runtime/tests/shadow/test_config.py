"""The shadow file: {} or empty turns shadowing off, a full one gives the config, the candidate never copies, and a
bad one says which field to fix."""

from __future__ import annotations

import json

import pytest

from skiff_runtime.shadow.compare import CompareMode, OutputRule
from skiff_runtime.shadow.config import ShadowTLS, parse_shadow_config

FULL = {
    "candidate": "v2",
    "target": "m-v2:8001",
    "sources": ["v1"],
    "ratio": 0.5,
    "queueSize": 8,
    "timeoutSeconds": 2,
    "compare": {"mode": "Exact"},
    "outputs": [{"name": "p", "mode": "Argmax", "topK": 3}],
}


@pytest.mark.parametrize("content", [b"", b"  \n", b"{}"])
def test_an_empty_file_turns_shadowing_off(content: bytes) -> None:
    assert parse_shadow_config(content) is None


def test_a_full_file_gives_every_setting() -> None:
    config = parse_shadow_config(json.dumps(FULL).encode())
    assert config is not None
    assert (config.candidate, config.target, config.sources) == ("v2", "m-v2:8001", ("v1",))
    assert (config.ratio, config.queue_size, config.timeout_s) == (0.5, 8, 2.0)
    assert config.rules.of("p") == OutputRule(CompareMode.ARGMAX, top_k=3)
    assert config.rules.of("other").mode is CompareMode.EXACT
    assert config.copies_from("v1")
    assert not config.copies_from("v2")  # the candidate never copies to itself
    assert not config.copies_from("v3")
    assert config.tls is None  # plaintext unless the file says TLS


def test_tls_names_the_server_name_and_the_ca_file() -> None:
    tls = {"serverName": "m-v2.ns.svc", "caFile": "/etc/skiff/tls/ca.crt"}
    config = parse_shadow_config(json.dumps({**FULL, "tls": tls}).encode())
    assert config is not None
    assert config.tls == ShadowTLS("m-v2.ns.svc", "/etc/skiff/tls/ca.crt")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"ratio": 0}, "'ratio' must be above 0 and at most 1"),
        ({"queueSize": 2000}, "'queueSize' must be at least 1 and at most 1024"),
        ({"queueSize": 1.5}, "'queueSize' must be an integer"),
        ({"target": ""}, "'target' must be a non-empty string"),
        ({"sources": "v1"}, "'sources' must list the versions"),
        ({"compare": {"mode": "Close"}}, "compare.mode must be one of Exact, Tolerance, Argmax"),
        ({"tls": {"caFile": "/ca.crt"}}, "'tls.serverName' must be a non-empty string"),
        ({"tls": {"serverName": "m-v2.ns.svc", "caFile": ""}}, "'tls.caFile' must be a non-empty string"),
        ({"tls": "on"}, "'tls' must be an object"),
    ],
)
def test_a_bad_file_names_the_field(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_shadow_config(json.dumps({**FULL, **change}).encode())


def test_a_file_that_is_not_json_says_how_to_turn_shadowing_off() -> None:
    with pytest.raises(ValueError, match=r"not JSON .*write \{\} to turn it off"):
        parse_shadow_config(b"ratio: 1")
