"""The node side's API connection (`nodeclient/`): credentials from a kubeconfig or a service account, over
real TLS to a real HTTPS server, and every kubeconfig it cannot use refused with one line."""

from __future__ import annotations

import base64
import http.server
import json
import shutil
import ssl
import subprocess
import threading
from pathlib import Path

import pytest

from nodefabric_devicemanager import nodeclient as api

SAN = "kubernetes.default.svc"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """A CA, a server certificate for kubernetes.default.svc, and a client certificate, all from openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "2", "-subj", "/CN=test-ca", cwd=d)  # fmt: skip
    (d / "san.ext").write_text(f"subjectAltName=DNS:{SAN}\n")
    for name, cn in (("server", SAN), ("client", "system:node:gpu-node-1")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={cn}", cwd=d)  # fmt: skip
        extra = ["-extfile", "san.ext"] if name == "server" else []
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "2", *extra, cwd=d)  # fmt: skip
    return d


class _Handler(http.server.BaseHTTPRequestHandler):
    seen: list[dict[str, str]]

    def do_GET(self) -> None:
        peer = self.connection.getpeercert() if isinstance(self.connection, ssl.SSLSocket) else None
        subject = dict(x[0] for x in (peer or {}).get("subject", ()))
        self.seen.append(
            {"authorization": self.headers.get("Authorization", ""), "client": subject.get("commonName", "")}
        )
        body = json.dumps({"kind": "Node", "metadata": {"name": "gpu-node-1", "uid": "u-1"}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def https(pki):
    """An HTTPS server with the test CA's certificate that asks for (and records) a client certificate."""
    seen: list[dict[str, str]] = []
    handler = type("H", (_Handler,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki / "server.crt", pki / "server.key")
    context.load_verify_locations(pki / "ca.crt")
    context.verify_mode = ssl.CERT_OPTIONAL
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def _kubeconfig(tmp_path: Path, cluster: dict, user: dict, name: str = "kc") -> str:
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": cluster}], "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }  # fmt: skip
    path = tmp_path / name
    path.write_text(json.dumps(doc))  # JSON is YAML
    return str(path)


def test_in_cluster_uses_the_service_account_and_follows_a_rotated_token(tmp_path, pki, https, monkeypatch):
    port, seen = https
    (tmp_path / "token").write_text("first\n")
    shutil.copy(pki / "ca.crt", tmp_path / "ca.crt")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(port))
    creds = api.in_cluster(str(tmp_path))
    # The service's DNS name is what the certificate names; the address is what the pod dials.
    client = api.Api(api.Credentials(creds.server, creds.ssl_context, SAN, token_file=creds.token_file))
    assert client.request("GET", "/api/v1/nodes/gpu-node-1")["metadata"]["uid"] == "u-1"
    (tmp_path / "token.new").write_text("second\n")
    (tmp_path / "token.new").rename(tmp_path / "token")  # the kubelet swaps the projected token atomically
    client.request("GET", "/api/v1/nodes/gpu-node-1")
    assert [s["authorization"] for s in seen] == ["Bearer first", "Bearer second"]
    assert client.requests == 2 and client.bytes_received > 0


def test_a_kubeconfig_with_ca_data_client_certificate_and_server_name(tmp_path, pki, https):
    port, seen = https
    cluster = {"server": f"https://127.0.0.1:{port}", "certificate-authority-data": _b64(pki / "ca.crt")}
    user = {"client-certificate-data": _b64(pki / "client.crt"), "client-key-data": _b64(pki / "client.key")}
    named = api.load(_kubeconfig(tmp_path, {**cluster, "tls-server-name": SAN}, user))
    assert named.request("GET", "/api/v1/nodes/gpu-node-1")["kind"] == "Node"
    assert seen[-1]["client"] == "system:node:gpu-node-1"

    unnamed = api.load(_kubeconfig(tmp_path, cluster, user, name="kc2"))
    with pytest.raises(api.ApiError) as refused:
        unnamed.request("GET", "/api/v1/nodes/gpu-node-1")
    assert refused.value.status == 0 and "certificate" in str(refused.value).lower()


def test_a_kubeconfig_with_a_ca_file_relative_to_it_and_a_token_file(tmp_path, pki, https):
    port, seen = https
    shutil.copy(pki / "ca.crt", tmp_path / "ca.crt")
    (tmp_path / "tok").write_text("from-file")
    cluster = {
        "server": f"https://127.0.0.1:{port}",
        "certificate-authority": "ca.crt",
        "tls-server-name": SAN,
    }
    client = api.load(_kubeconfig(tmp_path, cluster, {"tokenFile": "tok"}))
    client.request("GET", "/x")
    assert seen[-1]["authorization"] == "Bearer from-file"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("key: [unclosed", ["cannot be read"]),
        ("- a list", ["not a kubeconfig"]),
        ("apiVersion: v1\nclusters: []\n", ["no current context"]),
        ("current-context: c\ncontexts: [{name: c, context: {cluster: x, user: u}}]\n", ["no cluster"]),
        (
            "current-context: c\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
            "clusters: [{name: c, cluster: {server: 'https://x', certificate-authority-data: '!!'}}]\n",
            ["base64"],
        ),
        (
            "current-context: c\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
            "clusters: [{name: c, cluster: {server: 'https://x'}}]\n"
            "users: [{name: u, user: {auth-provider: {name: oidc}}}]\n",
            ["auth-provider", "token"],
        ),
        (
            "current-context: c\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
            "clusters: [{name: c, cluster: {server: 'ftp://x'}}]\n",
            ["not an http(s) URL"],
        ),
    ],
)
def test_kubeconfigs_it_cannot_use_are_refused_with_one_line(tmp_path, text, words):
    path = tmp_path / "kc"
    path.write_text(text)
    with pytest.raises(api.ConfigError) as refused:
        api.load(str(path))
    message = str(refused.value)
    assert "\n" not in message
    for word in words:
        assert word in message


def test_kubeconfig_files_merge_first_wins_and_a_missing_one_is_skipped(tmp_path, monkeypatch):
    first = _kubeconfig(tmp_path, {"server": "http://first:1"}, {"token": "a"}, name="one")
    second = _kubeconfig(tmp_path, {"server": "http://second:2"}, {"token": "b"}, name="two")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'absent'}:{first}:{second}")
    assert api.load().server == "http://first:1"
    monkeypatch.setenv("KUBECONFIG", "")
    monkeypatch.setenv("HOME", str(tmp_path / "nohome"))
    with pytest.raises(api.ConfigError, match="no kubeconfig"):
        api.load()


def test_an_answer_that_is_not_json_or_too_large_is_an_error_not_a_crash(tmp_path):
    class Garbage(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"\xff not json" if self.path == "/garbage" else b"[1, 2]"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Garbage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = api.Api(api.Credentials(f"http://127.0.0.1:{server.server_address[1]}"))
        with pytest.raises(api.ApiError, match="not JSON"):
            client.request("GET", "/garbage")
        with pytest.raises(api.ApiError, match="not a JSON object"):
            client.request("GET", "/list")
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (409, "conflict"),
        (410, "gone"),
        (0, "unavailable"),
        (429, "unavailable"),
        (500, "unavailable"),
        (503, "unavailable"),
        (400, "rejected"),
        (403, "rejected"),
        (404, "rejected"),
        (422, "rejected"),
    ],
)
def test_each_answer_is_classified_by_what_trying_again_can_do(status, kind):
    failure = api.classify(api.ApiError(status, f"GET /x: HTTP {status}"), "read x")
    assert (failure.kind, failure.status) == (kind, status)
    assert str(failure) == f"read x: GET /x: HTTP {status}"
    assert failure.retryable == (kind in ("conflict", "unavailable"))


def test_read_is_none_for_a_missing_object_and_requests_name_the_component(tmp_path):
    seen: list[tuple[str, str]] = []

    class Answers(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append((self.path, self.headers.get("User-Agent", "")))
            status = {"/missing": 404, "/forbidden": 403}.get(self.path, 200)
            body = b'{"kind": "Status"}' if status != 200 else b'{"metadata": {"name": "x"}}'
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        kubeconfig = _kubeconfig(
            tmp_path, {"server": f"http://127.0.0.1:{server.server_address[1]}"}, {"token": "t"}
        )
        client = api.load(kubeconfig, user_agent="nodefabric-draplugin")
        assert client.read("read missing", "/missing") is None
        assert client.read("read x", "/x") == {"metadata": {"name": "x"}}
        with pytest.raises(api.ApiFailure, match=r"^read forbidden: GET /forbidden: HTTP 403") as refused:
            client.read("read forbidden", "/forbidden")
        assert refused.value.kind == "rejected"
        assert api.load(kubeconfig).credentials.user_agent == "nodefabric-agent"
    finally:
        server.shutdown()
        server.server_close()
    assert seen == [(p, "nodefabric-draplugin") for p in ("/missing", "/x", "/forbidden")]
