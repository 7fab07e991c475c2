"""`nodefabric extender` as an operator runs it, the configuration file, and the wire encoder."""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from extender_fixtures import args, explicit, fleet, pod

from nodefabric_operator.extender.config import ConfigError, load_config
from nodefabric_operator.extender.wire import ExtenderArgs, FilterResult, parse_args


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _extender(*argv: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "nodefabric_devicemanager.cli", "extender", *argv]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_config_file_sets_levels_and_defaults(tmp_path: Path):
    path = tmp_path / "extender.yaml"
    path.write_text(
        "domain: example.org\n"
        "levels:\n"
        "  - {name: rack, keys: [example.org/rack], title: rack}\n"
        "  - {name: zone, keys: [topology.kubernetes.io/zone]}\n"
        "defaultLocality: zone\n"
        "defaultRank: first-fit\n"
        "homogeneousKeys: example.org/torch\n"
        "claimTTLSeconds: 30\n"
    )
    cfg = load_config(path)
    assert cfg.level_names == ("rack", "zone")
    assert (cfg.default_locality, cfg.default_rank, cfg.homogeneous_keys) == (
        "zone",
        "first-fit",
        ("example.org/torch",),
    )
    assert cfg.annotation_prefix == "placement.example.org/" and cfg.claim_ttl_seconds == 30
    assert load_config(None).level_names == ("fabric", "network-group", "zone", "region")
    assert load_config(None).levels[0].keys == ("feature.gpustack.ai/fabric.domain", "nvidia.com/gpu.clique")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("levels: [{name: zone, keys: []}]", "keys"),
        ("defaultLocality: rack", "defaultLocality 'rack' is not one of prefer"),
        ("defaultRank: random", "defaultRank"),
        ("levelz: []", "levelz"),
        ("levels: [{name: any, keys: [a]}]", "'prefer' and 'any' are policies"),
        ("- just a list", "must be a mapping"),
        ("levels: [", "cannot read extender config"),
    ],
)
def test_a_bad_config_file_is_a_clear_error(tmp_path: Path, text: str, message: str):
    path = tmp_path / "extender.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        load_config(path)


def test_cli_refuses_to_start_on_a_bad_config(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("defaultRank: random\n")
    proc = _extender("--config", str(bad), "--nodes-file", str(tmp_path / "none.json"))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert b"extender cannot start" in err and b"defaultRank" in err


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl binary to make a certificate")
def test_cli_serves_https_from_a_nodes_file(tmp_path: Path):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": fleet(per_zone=2)}))
    port = _free_port()
    proc = _extender("--nodes-file", str(nodes), "--port", str(port), "--address", "127.0.0.1",
                     "--tls-cert", str(cert), "--tls-key", str(key))  # fmt: skip
    ctx = ssl.create_default_context(cafile=str(cert))
    base = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/readyz", context=ctx, timeout=5) as resp:
                    assert resp.status == 200
                    break
            except OSError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
                assert time.monotonic() < deadline
                time.sleep(0.2)
        body = json.dumps(args(pod("g-0", gpus=8, **explicit("g", 2)), ["eu-a-0", "eu-a-1", "us-b-0"]))
        req = urllib.request.Request(f"{base}/filter", data=body.encode(), method="POST")
        with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
            result = json.loads(resp.read())
        assert sorted(result["NodeNames"]) == ["eu-a-0", "eu-a-1"]
        with urllib.request.urlopen(f"{base}/debug/groups", context=ctx, timeout=30) as resp:
            [group] = json.loads(resp.read())
        assert group["group"] == "ml/explicit/g" and group["location"] == "eu-a"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize("names", [["eu-a-0", "us-b-1"], ['we"ird', "back\\slash", "ünï"], []])
def test_the_fast_encoder_says_exactly_what_the_generic_one_says(names: list[str]):
    parsed: ExtenderArgs = parse_args(args(pod("p"), names))
    failed = {'reason with "quotes"': names[:1], "plain": names[1:]}
    result = FilterResult(parsed, names[1:], failed, {"never": names[:1]})
    assert json.loads(result.encode()) == result.wire()
    assert result.wire()["FailedNodes"] == {n: r for r, ns in failed.items() for n in ns}
