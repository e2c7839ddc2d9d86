"""The real node's configuration, without starting it: everything on loopback or the node's own addresses, every
file under its directory, safety rules for every guarded range, and a pause image `ctr images import` can read."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import re
import tarfile
from ipaddress import IPv4Network
from pathlib import Path

import pytest
from devtools.node.config import (
    NETWORK,
    NODE_LABEL,
    NODE_TAINT,
    NodePaths,
    containerd_config,
    kube_proxy_config,
    kubelet_config,
    overlapping_routes,
    pod_placement,
    safety_rules,
)
from devtools.node.kept_images import archive_digest, listed_images, stale_images
from devtools.node.network_policies import api_credentials, engine_argv, queue_bound, set_addresses
from devtools.node.scratch_image import write_scratch_image


def test_scratch_image_is_an_oci_layout_whose_digests_check_out(tmp_path: Path) -> None:
    archive = tmp_path / "pause.tar"
    write_scratch_image(archive, "localhost/pause:test", {"/pause": b"\x7fELF binary"}, ["/pause"], "65535:65535")
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        blobs = {}
        for name in names:
            if name.startswith("blobs/sha256/"):
                data = tar.extractfile(name).read()  # type: ignore[union-attr]
                assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
                blobs[f"sha256:{name.rsplit('/', 1)[1]}"] = data
        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
        assert json.loads(tar.extractfile("oci-layout").read()) == {"imageLayoutVersion": "1.0.0"}  # type: ignore[union-attr]
    (entry,) = index["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == "localhost/pause:test"
    manifest = json.loads(blobs[entry["digest"]])
    config = json.loads(blobs[manifest["config"]["digest"]])
    assert config["config"] == {"Entrypoint": ["/pause"], "User": "65535:65535"}
    (layer_entry,) = manifest["layers"]
    assert layer_entry["size"] == len(blobs[layer_entry["digest"]])
    layer = gzip.decompress(blobs[layer_entry["digest"]])
    assert config["rootfs"]["diff_ids"] == [f"sha256:{hashlib.sha256(layer).hexdigest()}"]
    with tarfile.open(fileobj=io.BytesIO(layer)) as files:
        (member,) = files.getmembers()
        assert (member.name, member.mode) == ("pause", 0o755)
        assert files.extractfile(member).read() == b"\x7fELF binary"  # type: ignore[union-attr]


def test_safety_rules_drop_every_guarded_range_unless_it_goes_to_the_pod_bridge() -> None:
    rules = safety_rules()
    guarded = {rule[rule.index("-d") + 1] for rule in rules if "-d" in rule}
    assert guarded == set(NETWORK.guarded)
    assert IPv4Network(NETWORK.pod_cidr).subnet_of(IPv4Network(NETWORK.guarded[0]))
    for rule in rules:
        assert rule[-2:] == ["-j", "DROP"]
        assert ["!", "-o", NETWORK.bridge] == rule[rule.index("!") : rule.index("!") + 3]
    forward = [rule for rule in rules if rule[2] == "FORWARD"]
    assert [rule[:5] for rule in forward] == [["-t", "filter", "FORWARD", "-i", NETWORK.bridge]]
    # mangle POSTROUTING sees the interface after kube-proxy's DNAT; OUTPUT would not.
    assert {tuple(rule[1:3]) for rule in rules if "-d" in rule} == {("mangle", "POSTROUTING")}


def test_kubelet_and_kube_proxy_serve_on_loopback_only(tmp_path: Path) -> None:
    kubelet = kubelet_config(NodePaths(tmp_path), tmp_path / "ca.crt")
    assert (kubelet["address"], kubelet["healthzBindAddress"], kubelet["readOnlyPort"]) == ("127.0.0.1", "127.0.0.1", 0)
    assert kubelet["authentication"]["anonymous"] == {"enabled": False}
    assert kubelet["authorization"] == {"mode": "Webhook"}
    proxy = kube_proxy_config(tmp_path / "kubeconfig")
    assert proxy["bindAddress"] == "127.0.0.1"
    assert proxy["healthzBindAddress"].startswith("127.0.0.1:")
    assert proxy["metricsBindAddress"].startswith("127.0.0.1:")
    assert proxy["nodePortAddresses"] == [f"{NETWORK.node_ip}/32"]
    assert proxy["iptables"]["localhostNodePorts"] is False  # else kube-proxy sets route_localnet=1


def test_only_pods_that_ask_for_the_node_land_on_it(tmp_path: Path) -> None:
    assert kubelet_config(NodePaths(tmp_path), tmp_path / "ca.crt")["registerWithTaints"] == [NODE_TAINT]
    placement = pod_placement()
    assert placement["nodeSelector"] == {NODE_LABEL: "true"}
    (toleration,) = placement["tolerations"]
    assert (toleration["key"], toleration["effect"]) == (NODE_TAINT["key"], NODE_TAINT["effect"])


def test_containerd_keeps_its_state_under_the_node_directory(tmp_path: Path) -> None:
    config = containerd_config(NodePaths(tmp_path / "node"))
    for key in ("root", "state", "address", "path", "conf_dir"):
        for value in re.findall(rf'^\s*{key} = "([^"]+)"', config, re.MULTILINE):
            assert value.startswith(str(tmp_path / "node")), (key, value)
    assert "restrict_oom_score_adj = true" in config  # lowering oom_score_adj needs CAP_SYS_RESOURCE
    kubelet = kubelet_config(NodePaths(tmp_path / "node"), tmp_path / "ca.crt")
    assert kubelet["failCgroupV1"] is False
    assert kubelet["imageGCHighThresholdPercent"] == 100  # imported images cannot be pulled again


def test_a_host_route_into_a_guarded_range_is_reported_before_any_rule_is_added() -> None:
    routes = [
        "default via 192.0.2.1 dev eth0",
        "192.0.2.0/24 dev eth0 proto kernel scope link src 192.0.2.2",
        "10.0.0.0/8 via 192.0.2.1 dev eth0",
        "10.88.0.0/16 dev podman0 proto kernel scope link src 10.88.0.1",
    ]
    assert overlapping_routes(NETWORK, routes) == ["10.0.0.0/8 via 192.0.2.1 dev eth0"]
    assert overlapping_routes(NETWORK, routes[:2] + routes[3:]) == []


def test_a_kept_image_store_is_containerds_root_and_the_rest_stays_under_the_node_directory(tmp_path: Path) -> None:
    store = tmp_path / "cache" / "containerd"
    config = containerd_config(NodePaths(tmp_path / "node", store))
    assert f'root = "{store}"' in config
    assert f'state = "{tmp_path / "node"}' in config
    assert f'address = "{tmp_path / "node"}' in config


def test_an_archive_is_recognised_in_the_store_by_name_and_manifest_digest(tmp_path: Path) -> None:
    archive = tmp_path / "pause.tar"
    write_scratch_image(archive, "localhost/pause:test", {"/pause": b"x"}, ["/pause"], "65535:65535")
    again = tmp_path / "again.tar"
    write_scratch_image(again, "localhost/pause:test", {"/pause": b"x"}, ["/pause"], "65535:65535")
    other = tmp_path / "other.tar"
    write_scratch_image(other, "localhost/pause:test", {"/pause": b"y"}, ["/pause"], "65535:65535")
    digest = archive_digest(archive)
    assert digest.startswith("sha256:")
    assert archive_digest(again) == digest  # the pause image is rebuilt every session: the same bytes each time
    assert archive_digest(other) != digest
    listing = (
        "REF                  TYPE                                                 DIGEST  SIZE    PLATFORMS LABELS\n"
        f"localhost/pause:test application/vnd.oci.image.manifest.v1+json {digest} 1.4 MiB linux/amd64 -\n"
    )
    assert listed_images(listing) == {"localhost/pause:test": digest}
    assert listed_images(listing.splitlines()[0]) == {}


def test_the_store_keeps_the_most_recently_used_images_of_each_repository_and_their_id_references() -> None:
    runtime = [f"localhost/skiff-runtime:0.1.0-{n}" for n in "abcde"]
    used = {name: float(t) for t, name in enumerate(runtime)} | {"localhost/pause:skiff": 9.0}
    present = {name: f"sha256:{i}" for i, name in enumerate(runtime)}
    present |= {"localhost/pause:skiff": "sha256:p", "localhost/stray:1": "sha256:s"}
    present |= {f"sha256:config{i}": f"sha256:{i}" for i in range(5)} | {"sha256:configp": "sha256:p"}
    stale = stale_images(used, present, keep=3)
    assert stale == sorted([runtime[0], runtime[1], "localhost/stray:1", "sha256:config0", "sha256:config1"])
    kept = {name: digest for name, digest in present.items() if name not in stale}
    assert stale_images(used, kept, keep=3) == []


def test_the_network_policy_engine_gets_the_kubeconfigs_certificates_as_files_and_serves_on_loopback() -> None:
    b64 = {name: base64.b64encode(name.encode()).decode() for name in ("ca", "cert", "key")}
    kubeconfig = {
        "clusters": [{"cluster": {"server": "https://127.0.0.1:32766", "certificate-authority-data": b64["ca"]}}],
        "users": [{"user": {"client-certificate-data": b64["cert"], "client-key-data": b64["key"]}}],
    }
    credentials = api_credentials(kubeconfig)
    assert credentials.server == "https://127.0.0.1:32766"
    expected = {"certificate-authority": b"ca", "client-certificate": b"cert", "client-key": b"key"}
    assert dict(credentials.files) == expected
    files = {flag: Path("/node/network-policies") / flag for flag in credentials.files}
    argv = engine_argv(Path("/bin/knp"), credentials.server, files, "127.0.0.1:9999")
    assert argv[0] == "/bin/knp"
    assert "--server=https://127.0.0.1:32766" in argv
    assert "--client-key=/node/network-policies/client-key" in argv
    assert "--hostname-override=real-node" in argv
    assert "--disable-nri" in argv
    assert "--metrics-bind-address=127.0.0.1:9999" in argv
    assert not any(a.startswith("--fail-open") for a in argv)  # fail-closed: no queue listener, no connection


def test_a_kubeconfig_with_a_token_instead_of_a_client_certificate_is_refused_with_what_to_use() -> None:
    kubeconfig = {"clusters": [{"cluster": {"server": "https://x", "certificate-authority-data": "Y2E="}}],
                  "users": [{"user": {"token": "secret-token"}}]}  # fmt: skip
    with pytest.raises(ValueError, match="client-certificate-data") as refused:
        api_credentials(kubeconfig)
    assert "secret-token" not in str(refused.value)


def test_the_engines_pod_set_and_queue_are_read_from_nft_and_proc() -> None:
    listing = """table inet kube-network-policies {
	set podips-v4 {
		type ipv4_addr
		elements = { 10.244.0.5, 10.244.0.7 }
	}
}"""
    assert set_addresses(listing) == {"10.244.0.5", "10.244.0.7"}
    assert set_addresses("table inet kube-network-policies {\n\tset podips-v4 {\n\t}\n}") == set()
    assert queue_bound("  100  12345     0 2 65531     0     0        0  1\n")
    assert not queue_bound("  101  12345     0 2 65531     0     0        0  1\n")
    assert not queue_bound("")
