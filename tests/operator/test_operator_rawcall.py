"""rawcall's answer reader: what the generated custom-object calls return (a JSON object), and a clear
ValueError for any other answer, so no caller reads a list or a string as an object."""

from __future__ import annotations

import http.server
import pathlib
import threading

import kubernetes
import pytest

from nodefabric_operator import rawcall


def test_an_object_answer_is_read_as_a_dict() -> None:
    assert rawcall.json_object(b'{"metadata": {"name": "gpu-0"}, "status": {}}') == {
        "metadata": {"name": "gpu-0"},
        "status": {},
    }


@pytest.mark.parametrize(
    ("answer", "said"),
    [(b"[]", "a list, not an object"), (b'"ok"', "a str, not an object"), (b"null", "a NoneType")],
)
def test_an_answer_that_is_not_an_object_is_refused_by_name(answer: bytes, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        rawcall.json_object(answer)


@pytest.mark.parametrize("answer", [b"", b"<html>502 Bad Gateway</html>", b"\xff\xfe", b'{"a": '])
def test_garbage_is_a_value_error(answer: bytes) -> None:
    with pytest.raises(ValueError, match=r"^the API server's answer is not JSON: "):
        rawcall.json_object(answer)


class _TokenServer(http.server.BaseHTTPRequestHandler):
    """Answers a GET with `{}` only for the token it holds now: an expired credential is refused with
    401, as an API server refuses one."""

    valid = ""

    def do_GET(self) -> None:
        ok = self.headers.get("authorization") == f"Bearer {_TokenServer.valid}"
        body = b"{}" if ok else b'{"kind":"Status","code":401,"reason":"Unauthorized"}'
        self.send_response(200 if ok else 401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


def test_a_token_refused_within_the_refresh_interval_is_refreshed_and_the_request_sent_again(
    tmp_path: pathlib.Path,
) -> None:
    """The refresh hook runs at most once a second; a credential that expired inside that second (an exec
    plugin's token, refreshed by the hook only once expired) must not fail the request: a 401 makes the
    hook run now, and the request is sent once more with what it gives."""
    token = tmp_path / "token"
    token.write_text("first")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _TokenServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = kubernetes.client.Configuration()
    config.host = f"http://127.0.0.1:{server.server_address[1]}"
    config.api_key = {"authorization": "Bearer " + token.read_text()}

    def refresh(conf: kubernetes.client.Configuration) -> None:
        conf.api_key["authorization"] = "Bearer " + token.read_text()

    config.refresh_api_key_hook = refresh
    api = kubernetes.client.ApiClient(config)
    try:
        _TokenServer.valid = "first"
        assert rawcall.send(api, "GET", "/api", {}) == b"{}"
        token.write_text("second")  # rotated, the old one refused at once
        _TokenServer.valid = "second"
        assert rawcall.send(api, "GET", "/api", {}) == b"{}"
        # A credential that the refresh does not cure is still refused, after one retry only.
        _TokenServer.valid = "third"
        with pytest.raises(kubernetes.client.ApiException) as refused:
            rawcall.send(api, "GET", "/api", {})
        assert refused.value.status == 401
    finally:
        api.close()  # type: ignore[no-untyped-call]
        server.shutdown()
        server.server_close()
