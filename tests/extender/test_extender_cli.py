"""`nodefabric extender` as an operator runs it, the configuration file, and the wire encoder."""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
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
    cmd = [sys.executable, "-m", "nodefabric_operator.console", "extender", *argv]
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


@pytest.fixture
def fails_to_start(console):
    """Run the extender (in this process) expecting a start-up failure: exit 2, one line on stderr."""

    def run(*argv: str) -> str:
        done = console("extender", *argv)
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr
        return done.stderr

    return run


def test_cli_refuses_to_start_on_a_bad_config(fails_to_start, tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("defaultRank: random\n")
    err = fails_to_start("--config", str(bad), "--nodes-file", str(tmp_path / "none.json"))
    assert "extender cannot start" in err and "defaultRank" in err


def test_cli_refuses_a_nodes_file_with_list_valued_labels(fails_to_start, tmp_path: Path):
    nodes = fleet(per_zone=1)
    nodes[3]["metadata"]["labels"]["topology.kubernetes.io/zone"] = ["eu-a", "eu-b"]
    path = tmp_path / "nodes.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes}))
    err = fails_to_start("--nodes-file", str(path))
    assert "item 3: Node.metadata.labels['topology.kubernetes.io/zone']: must be a string, got list" in err


@pytest.mark.parametrize("flag", ["--config", "--nodes-file", "--tls-cert", "--tls-client-ca"])
def test_cli_refuses_a_fifo_or_a_directory_instead_of_a_file(fails_to_start, tmp_path: Path, flag: str):
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps(fleet(per_zone=1)))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it for reading blocks until a writer comes: start-up would hang forever
    argv = {"--nodes-file": str(nodes), "--tls-cert": str(nodes), "--tls-key": str(nodes)}
    for bad in (fifo, tmp_path):
        if flag == "--tls-client-ca":
            argv["--address"] = "0.0.0.0"
        err = fails_to_start(*(x for k, v in {**argv, flag: str(bad)}.items() for x in (k, v)))
        assert f"{bad} is not a regular file" in err


def test_cli_refuses_a_busy_port(fails_to_start, tmp_path: Path):
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps(fleet(per_zone=1)))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        err = fails_to_start("--nodes-file", str(nodes), "--port", str(port))
    assert "cannot listen" in err and "address already in use" in err.lower()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--address", "0.0.0.0"], "--address 0.0.0.0 would let any pod that reaches it steer placement"),
        (["--address", "10.1.2.3", "--tls-cert", "c", "--tls-key", "k"], "verify clients with --tls-cert"),
        (["--tls-cert", "c"], "--tls-cert and --tls-key go together"),
        (["--tls-client-ca", "ca"], "--tls-client-ca needs --tls-cert and --tls-key"),
        (["--tls-cert", "/nonexistent.crt", "--tls-key", "/nonexistent.key"], "No such file"),
        (["--max-request-bytes", "10"], "--max-request-bytes must be at least 1024"),
        (
            ["--max-in-flight-bytes", "100"],
            "--max-in-flight-bytes must hold one body (--max-request-bytes, 67108864), got 100",
        ),
    ],
)
def test_cli_refuses_unsafe_or_broken_listeners(
    fails_to_start, tmp_path: Path, argv: list[str], message: str
):
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps(fleet(per_zone=1)))
    assert message in fails_to_start("--nodes-file", str(nodes), *argv)


def test_cli_refuses_a_bad_flag_value_without_a_traceback(console):
    done = console("extender", "--read-timeout", "-1")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "must be a positive number of seconds" in done.stderr


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _certificates(d: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate it signed, and a client
    certificate signed by another CA: real certificates, made by openssl for this test."""
    paths = {}
    for ca in ("ca", "rogue-ca"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={ca}",
                 "-keyout", str(d / f"{ca}.key"), "-out", str(d / f"{ca}.crt"))  # fmt: skip
        paths[ca] = d / f"{ca}.crt"
    for name, ca, extra in (
        ("server", "ca", ["-extfile", str(d / "san.cnf")]),
        ("client", "ca", []),
        ("rogue", "rogue-ca", []),
    ):
        (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                 "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"))  # fmt: skip
        _openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / f"{ca}.crt"),
                 "-CAkey", str(d / f"{ca}.key"), "-CAcreateserial", "-days", "1",
                 "-out", str(d / f"{name}.crt"), *extra)  # fmt: skip
        paths[name] = d / f"{name}.crt"
        paths[f"{name}-key"] = d / f"{name}.key"
    return paths


def _wait_ready(proc: subprocess.Popen[bytes], url: str, ctx: ssl.SSLContext | None = None) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url, context=ctx, timeout=5) as resp:
                assert resp.status == 200
                return
        except OSError:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
            assert time.monotonic() < deadline
            time.sleep(0.2)


def _stall(port: int, length: int) -> socket.socket:
    """A connection whose request announced `length` bytes and sent all but the last, once its handler
    started (the interim 100 Continue): the server holds them, counted as they arrive."""
    conn = socket.create_connection(("127.0.0.1", port), timeout=30)
    head = f"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\nExpect: 100-continue\r\n\r\n"
    conn.sendall(head.encode())
    assert conn.recv(64).startswith(b"HTTP/1.1 100")
    conn.sendall(b"{" + b" " * (length - 2))
    return conn


def _refused(req: urllib.request.Request) -> urllib.error.HTTPError:
    """The request's refusal, asked again until the stalled bodies' bytes are counted (the server reads
    them on its own turn); bounded, never timed."""
    for _ in range(200):
        try:
            urllib.request.urlopen(req, timeout=30).close()
        except urllib.error.HTTPError as refused:
            return refused
        time.sleep(0.05)
    raise AssertionError("never refused")


@pytest.mark.parametrize(
    ("argv", "stalled", "held"),
    [([], 2, "8,190"), (["--max-in-flight-bytes", "4096"], 1, "4,095")],
    ids=["default-two-bodies", "flag"],
)
def test_cli_bounds_the_bytes_of_bodies_read_at_once(
    tmp_path: Path, argv: list[str], stalled: int, held: str
) -> None:
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps(fleet(per_zone=1)))
    port = _free_port()
    proc = _extender("--nodes-file", str(nodes), "--port", str(port), "--max-request-bytes", "4096", *argv)
    conns: list[socket.socket] = []
    try:
        _wait_ready(proc, f"http://127.0.0.1:{port}/readyz")
        conns = [_stall(port, 4096) for _ in range(stalled)]
        body = json.dumps(args(pod("web"), ["eu-a-0"])).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/filter", data=body, method="POST")
        refused = _refused(req)
        assert refused.code == 503
        assert json.loads(refused.read()) == {
            "Error": f"{held} bytes of other request bodies are being read; try again"
        }
    finally:
        for conn in conns:
            conn.close()
        proc.terminate()
        assert proc.wait(timeout=30) == 0


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl binary to make certificates")
def test_cli_serves_https_only_to_clients_with_a_certificate_from_the_ca(tmp_path: Path):
    certs = _certificates(tmp_path)
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": fleet(per_zone=2)}))
    port, probe = _free_port(), _free_port()
    proc = _extender("--nodes-file", str(nodes), "--address", "0.0.0.0", "--port", str(port),
                     "--metrics-address", "127.0.0.1", "--metrics-port", str(probe),
                     "--tls-cert", str(certs["server"]), "--tls-key", str(certs["server-key"]),
                     "--tls-client-ca", str(certs["ca"]))  # fmt: skip
    base = f"https://127.0.0.1:{port}"

    def client(cert: str | None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(certs["ca"]))
        if cert:
            ctx.load_cert_chain(certs[cert], certs[f"{cert}-key"])
        return ctx

    try:
        _wait_ready(proc, f"http://127.0.0.1:{probe}/readyz")
        body = json.dumps(args(pod("g-0", gpus=8, **explicit("g", 2)), ["eu-a-0", "eu-a-1", "us-b-0"]))
        req = urllib.request.Request(f"{base}/filter", data=body.encode(), method="POST")
        with urllib.request.urlopen(req, context=client("client"), timeout=30) as resp:
            assert sorted(json.loads(resp.read())["NodeNames"]) == ["eu-a-0", "eu-a-1"]
        for cert in (None, "rogue"):  # no certificate, or one another CA signed: no TLS session at all
            with (
                pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)),
                urllib.request.urlopen(f"{base}/debug/groups", context=client(cert), timeout=30) as resp,
            ):
                resp.read()
        # The probe listener answers probes and metrics, never the verbs.
        with urllib.request.urlopen(f"http://127.0.0.1:{probe}/metrics", timeout=30) as resp:
            assert b"nodefabric_extender_request_duration_seconds" in resp.read()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{probe}/filter", data=b"{}"))
        assert refused.value.code == 404
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0  # SIGTERM is a clean stop


@pytest.mark.parametrize("names", [["eu-a-0", "us-b-1"], ["gpu-1.rack-2.example.com"], []])
def test_the_fast_encoder_says_exactly_what_the_generic_one_says(names: list[str]):
    parsed: ExtenderArgs = parse_args(args(pod("p"), names))
    failed = {'reason with "quotes" and \\ and \u00fc': names[:1], "plain": names[1:]}
    result = FilterResult(parsed, names[1:], failed, {"never": names[:1]})
    assert json.loads(result.encode()) == result.wire()
    assert result.wire()["FailedNodes"] == {n: r for r, ns in failed.items() for n in ns}
