"""__main__: the command line of `skiff-operator run`."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from skiff_operator.__main__ import SILENCED_BELOW_INFO, configure_logging, parse_run_config
from skiff_operator.spec import DEFAULT_IMAGE, SpreadDomain


def test_namespaces_are_repeatable() -> None:
    config = parse_run_config(["run", "--namespace", "a", "-n", "b", "--liveness", "http://0.0.0.0:8080/healthz"])
    assert config.namespaces == ("a", "b")
    assert config.options.namespaces == ("a", "b")  # the Pod watches run per namespace
    assert config.clusterwide is False
    assert config.liveness_endpoint == "http://0.0.0.0:8080/healthz"


def test_all_namespaces() -> None:
    config = parse_run_config(["run", "--all-namespaces", "--standalone", "--resync-seconds", "15"])
    assert config.clusterwide is True
    assert config.options.namespaces == ()
    assert config.standalone is True
    assert config.options.resync_interval_s == 15


def test_run_is_the_default_command() -> None:
    assert parse_run_config(["-A"]).clusterwide is True


def test_namespaces_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKIFF_OPERATOR_NAMESPACES", "ml, nlp")
    assert parse_run_config(["run"]).namespaces == ("ml", "nlp")


def test_scope_is_required(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("SKIFF_OPERATOR_NAMESPACES", raising=False)
    with pytest.raises(SystemExit):
        parse_run_config(["run"])
    assert "--all-namespaces" in capsys.readouterr().err


def test_namespace_and_all_namespaces_exclude_each_other() -> None:
    with pytest.raises(SystemExit):
        parse_run_config(["run", "-n", "a", "-A"])


def test_debug_logging_never_prints_api_response_bodies(caplog: pytest.LogCaptureFixture) -> None:
    """The API client logs response bodies (Secrets' data included) at DEBUG; --log-level DEBUG must not show
    them (found by e2e/test_faults.py)."""
    root_level = logging.getLogger().level
    try:
        configure_logging("DEBUG")
        with caplog.at_level(logging.DEBUG):
            logging.getLogger("kubernetes_asyncio.client.rest").debug("response body: %s", b"tls.key: c2VjcmV0")
            logging.getLogger("skiff_operator.handlers").debug("applied Deployment/bert-v1")
    finally:
        logging.getLogger().setLevel(root_level)
        for name in SILENCED_BELOW_INFO:
            logging.getLogger(name).setLevel(logging.NOTSET)
    assert "c2VjcmV0" not in caplog.text
    assert "applied Deployment/bert-v1" in caplog.text


def test_namespace_patterns_are_refused_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_run_config(["run", "-n", "ml-*"])
    assert "patterns are not supported" in capsys.readouterr().err


def test_kopf_per_event_lines_are_quiet_unless_debug() -> None:
    logger = logging.getLogger("kopf.objects")
    root_level = logging.getLogger().level
    try:
        configure_logging("INFO")
        assert logger.getEffectiveLevel() == logging.WARNING
        logger.setLevel(logging.NOTSET)
        configure_logging("DEBUG")
        assert logger.level == logging.NOTSET  # not quieted: DEBUG shows every line
    finally:
        logging.getLogger().setLevel(root_level)
        logger.setLevel(logging.NOTSET)


def test_leader_election_needs_the_lease_namespace(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SKIFF_OPERATOR_POD_NAMESPACE", raising=False)
    with pytest.raises(SystemExit):
        parse_run_config(["run", "-n", "ml", "--leader-elect"])
    assert "--lease-namespace" in capsys.readouterr().err
    config = parse_run_config(["run", "-n", "ml", "--leader-elect", "--lease-namespace", "ops", "--workers", "4"])
    assert config.options.lease is not None
    assert (config.options.lease.name, config.options.lease.namespace) == ("skiff-operator", "ops")
    assert config.options.workers == 4
    assert parse_run_config(["run", "-n", "ml"]).options.lease is None


def test_workers_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_run_config(["run", "-n", "ml", "--workers", "0"])
    assert "--workers 0" in capsys.readouterr().err


DEEP_DECODE = """
import copy, json, sys
from skiff_operator.__main__ import API_SERVER_MAX_JSON_DEPTH, allow_api_server_depth
if sys.argv[1] == "guarded":
    allow_api_server_depth()
depth = API_SERVER_MAX_JSON_DEPTH
text = '{"f:x":' * depth + "{}" + "}" * depth  # a watch event's object, as deep as the API server decodes
try:
    copy.deepcopy(json.loads(text))  # what kopf's watcher and its diff do with every event
except RecursionError:
    print("RecursionError")
else:
    print("decoded")
"""


@pytest.mark.parametrize(("mode", "outcome"), [("guarded", "decoded"), ("default", "RecursionError")])
def test_the_deepest_body_the_api_server_sends_decodes_once_guarded(mode: str, outcome: str) -> None:
    """kopf decodes each watch event with json.loads: at Python's default recursion limit a body 1,500 deep (the
    API server stores client-written managedFields as sent) raised RecursionError and ended the operator."""
    done = subprocess.run([sys.executable, "-c", DEEP_DECODE, mode], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == outcome


def test_route_settle_seconds_is_an_option_within_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_run_config(["run", "-n", "ml"]).options.route_settle_s == 3.0
    assert parse_run_config(["run", "-n", "ml", "--route-settle-seconds", "0"]).options.route_settle_s == 0.0
    for bad in ("-1", "301", "nan"):
        with pytest.raises(SystemExit):
            parse_run_config(["run", "-n", "ml", "--route-settle-seconds", bad])
        assert f"--route-settle-seconds {bad}" in capsys.readouterr().err


def test_the_default_runtime_image_and_spread_reach_the_operators_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    plain = parse_run_config(["run", "-n", "ml"]).options.defaults
    assert (plain.runtime_image, plain.spread_across) == (DEFAULT_IMAGE, ())
    chosen = parse_run_config(
        ["run", "-n", "ml", "--default-runtime-image", "registry.local:5000/ml/skiff-runtime:0.1.0",
         "--default-spread-across", "Nodes,Zones"]
    ).options.defaults  # fmt: skip
    assert chosen.runtime_image == "registry.local:5000/ml/skiff-runtime:0.1.0"
    assert chosen.spread_across == (SpreadDomain.NODES, SpreadDomain.ZONES)
    for flag, bad, said in (
        ("--default-spread-across", "Racks", "give one of Nodes, Zones"),
        ("--default-runtime-image", "two words", "give an image reference"),
    ):
        with pytest.raises(SystemExit):
            parse_run_config(["run", "-n", "ml", flag, bad])
        assert said in capsys.readouterr().err
