"""Both of the operator's clients (aioclient on the loop, rawcall in a thread) against a server that answers
what a broken or hostile API server, or a proxy in front of one, would: real sockets, the server writing
raw bytes, so nothing between it and the client tidies an answer up. Whatever the answer, both clients
must make the same of it (wire.py's bounds)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import json
import pathlib
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from urllib.parse import quote

import aiohttp
import kubernetes
import pytest
import yaml

from nodefabric_devicemanager.kubeclient import load_client, proxy_authorization
from nodefabric_operator import apicall, rawcall, wire
from nodefabric_operator.aioclient import AsyncClient, Driver
from nodefabric_operator.apicall import Calls, Request
from nodefabric_operator.metrics import Metrics
from nodefabric_operator.reconcile import transient

CLIENTS = ["loop", "thread"]
GET = Request("get", "devices", "GET", "/apis/x/v1/devices/{name}", {"name": "n1"})


@dataclass
class Conn:
    """One accepted connection: its number (0 for the first) and the requests read on it."""

    sock: socket.socket
    number: int
    requests: list[bytes] = field(default_factory=list)

    def request(self) -> bytes | None:
        """The next request's head and body (by its Content-Length); None when the client closed."""
        data = b""
        while b"\r\n\r\n" not in data:
            got = self.sock.recv(65536)
            if not got:
                return None
            data += got
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(body) < length:
            body += self.sock.recv(65536)
        self.requests.append(head + b"\r\n\r\n" + body)
        return head

    def answer(self, body: bytes = b'{"kind":"Devices"}', *, head: str = "", status: str = "200 OK") -> None:
        start = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.sock.sendall(f"{start}{head}\r\n".encode() + body)


@dataclass
class Served:
    url: str
    conns: list[Conn]
    sent: list[int]  # bytes of body the handler got out before the client went away, when it counts


@contextlib.contextmanager
def raw_server(handle: Callable[[Conn, Served], None]) -> Iterator[Served]:
    listener = socket.create_server(("127.0.0.1", 0))
    served = Served(f"http://127.0.0.1:{listener.getsockname()[1]}", [], [])

    def one(conn: Conn) -> None:
        with contextlib.suppress(OSError), conn.sock:
            handle(conn, served)

    def accept() -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            conn = Conn(sock, len(served.conns))
            served.conns.append(conn)
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield served
    finally:
        listener.close()
        for conn in served.conns:
            with contextlib.suppress(OSError):
                conn.sock.close()


def one_call(request: Request) -> Calls[bytes]:
    return (yield request)


def api_at(url: str) -> kubernetes.client.ApiClient:
    config = kubernetes.client.Configuration()
    config.host = url
    config.retries = 0  # as load_client sets it
    return kubernetes.client.ApiClient(config)


async def send(kind: str, api: kubernetes.client.ApiClient, *requests: Request) -> list[bytes]:
    """Each request sent in turn by one client of `kind` (its connections kept between them)."""
    if kind == "thread":
        return [await asyncio.to_thread(apicall.run, one_call(r), api, Metrics()) for r in requests]
    client = AsyncClient(api)
    try:
        return [await apicall.arun(one_call(r), client, Metrics()) for r in requests]
    finally:
        await client.close()


def answered(conn: Conn, served: Served) -> None:
    while conn.request() is not None:
        conn.answer()


# --- item: an answer's size is bounded -------------------------------------------------------------------


def endless(framing: str) -> Callable[[Conn, Served], None]:
    """Answers the first connection's request with a body that never ends (chunked, up to a close that
    never comes, or announcing 100 GB), counting what it got out; later connections are answered."""

    def handle(conn: Conn, served: Served) -> None:
        if conn.number:
            return answered(conn, served)
        conn.request()
        heads = {
            "chunked": "Transfer-Encoding: chunked\r\n",
            "close": "Connection: close\r\n",
            "announced": "Content-Length: 100000000000\r\n",
            # What http.client reads up to the close, whatever a parser of the header alone makes of it:
            "negative": "Content-Length: -1\r\n",
            "listed": "Content-Length: 10, 10\r\n",
            "both": "Content-Length: 10\r\nTransfer-Encoding: chunked\r\n",  # chunked wins, if taken
        }
        conn.sock.sendall(
            f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{heads[framing]}\r\n".encode()
        )
        piece = b"[" + b"0," * 32767 + b"0"
        sent = 0
        try:
            while sent < 4 * wire.MAX_ANSWER:  # a bound for the test's sake: the client must stop long before
                conn.sock.sendall(
                    b"%x\r\n%s\r\n" % (len(piece), piece) if framing in ("chunked", "both") else piece
                )
                sent += len(piece)
        finally:
            served.sent.append(sent)

    return handle


def socket_slack() -> int:
    """What a server may get out past what the client read before it closed: the kernel's buffers of the
    two sockets (the receiver's grows up to tcp_rmem's maximum, 32 MiB on some hosts: a fixed 16 MiB
    failed a loaded run at 18 MiB past the bound) and a piece read past the bound."""
    try:
        rmem, wmem = (
            int(pathlib.Path(f"/proc/sys/net/ipv4/tcp_{b}mem").read_text().split()[2]) for b in "rw"
        )
    except (OSError, ValueError, IndexError):
        rmem, wmem = 8 * 1024 * 1024, 8 * 1024 * 1024
    return rmem + wmem + 2 * wire.CHUNK


@pytest.mark.parametrize("kind", CLIENTS)
@pytest.mark.parametrize("framing", ["chunked", "close", "announced", "negative", "listed", "both"])
async def test_an_endless_answer_is_refused_at_the_bound_and_the_next_call_goes_through(
    kind: str, framing: str
) -> None:
    """A body that never ends is read up to MAX_ANSWER and refused (AnswerTooLarge, an error every caller
    retries), never buffered whole nor cut and parsed; the connection is dropped (the server's writes
    fail soon after the bound), and the client's next call, on a new connection, is answered. A
    Content-Length that is negative or listed twice is either refused by the client's parser (aiohttp)
    or, listed, read as no length at all by http.client: bounded the same. (A negative one is refused
    by both from the head.)"""
    with raw_server(endless(framing)) as served:
        api = api_at(served.url)
        client = AsyncClient(api) if kind == "loop" else None
        try:
            with pytest.raises(Exception) as refused:
                if client is not None:
                    await apicall.arun(one_call(GET), client, Metrics())
                else:
                    await asyncio.to_thread(apicall.run, one_call(GET), api, Metrics())
            assert transient(refused.value)
            if kind == "loop" and framing in ("negative", "listed", "both"):  # aiohttp refuses the head
                assert isinstance(refused.value, aiohttp.ClientResponseError), repr(refused.value)
            elif framing == "negative":  # no length: the threaded client refuses the head too
                assert isinstance(refused.value, rawcall.AnswerBroken), repr(refused.value)
            else:
                assert isinstance(refused.value, wire.AnswerTooLarge), repr(refused.value)
                assert f"larger than {wire.MAX_ANSWER} bytes" in str(refused.value)
            if framing == "announced":
                assert "Content-Length 100000000000" in str(refused.value)
            if client is not None:
                again = await apicall.arun(one_call(GET), client, Metrics())
            else:
                again = await asyncio.to_thread(apicall.run, one_call(GET), api, Metrics())
            assert json.loads(again) == {"kind": "Devices"}
            for _ in range(200):
                if served.sent:
                    break
                await asyncio.sleep(0.05)
            # Refused from the head (announced) or soon past the bound (socket buffers aside): not read on.
            (sent,) = served.sent
            assert sent < wire.MAX_ANSWER + socket_slack()
        finally:
            if client is not None:
                await client.close()
            api.close()


@pytest.mark.parametrize("kind", CLIENTS)
async def test_a_body_at_the_bound_is_read_whole_and_one_byte_more_is_refused(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bound is exact, announced or not (a bound of 1 MiB here, for speed): MAX_ANSWER bytes are an
    answer, read and parsed whole; one more is refused."""
    monkeypatch.setattr(wire, "MAX_ANSWER", 1024 * 1024)
    monkeypatch.setattr(wire, "CHUNK", 1000)  # the bound falls inside a piece
    body = json.dumps({"pad": "x" * (wire.MAX_ANSWER - 11)}).encode()
    assert len(body) == wire.MAX_ANSWER

    def handle(conn: Conn, served: Served) -> None:
        while (head := conn.request()) is not None:
            data = body + b" " if b"/more" in head.split(b"\r\n")[0] else body
            if b"chunked" in head.split(b"\r\n")[0]:
                conn.sock.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                conn.sock.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
            else:
                conn.answer(data)

    with raw_server(handle) as served:
        for path in ("/exact", "/exact/chunked"):
            (got,) = await send(kind, api_at(served.url), Request("get", "x", "GET", path))
            assert got == body
        for path in ("/more", "/more/chunked"):
            with pytest.raises(wire.AnswerTooLarge):
                await send(kind, api_at(served.url), Request("get", "x", "GET", path))


@pytest.mark.parametrize("kind", CLIENTS)
async def test_a_compressed_answer_is_bounded_by_what_it_decodes_to(kind: str) -> None:
    """A gzip body of a few KB that decodes to 2 x MAX_ANSWER (its Content-Length is the compressed
    size): refused at the bound of what it decodes to, not taken for a small answer."""
    bomb = gzip.compress(b" " * (2 * wire.MAX_ANSWER), compresslevel=9)
    assert len(bomb) < wire.MAX_ANSWER // 100

    def handle(conn: Conn, served: Served) -> None:
        while conn.request() is not None:
            conn.answer(bomb, head="Content-Encoding: gzip\r\n")

    with raw_server(handle) as served, pytest.raises(wire.AnswerTooLarge):
        await send(kind, api_at(served.url), GET)


# --- item: a long header line is accepted as the threaded client accepts it ------------------------------


@pytest.mark.parametrize("kind", CLIENTS)
async def test_a_20_kb_header_is_accepted_by_both_clients(kind: str) -> None:
    """A 20 KB header (a proxy's or a server's: a long Warning or cookie) was refused by aiohttp's default
    bound of 8,190 bytes and the write retried for ever; both clients read the answer now."""

    def handle(conn: Conn, served: Served) -> None:
        while conn.request() is not None:
            conn.answer(head=f'X-Long: {"a" * 20_000}\r\nWarning: 299 - "{"w" * 20_000}"\r\n')

    with raw_server(handle) as served:
        (got,) = await send(kind, api_at(served.url), GET)
        assert json.loads(got) == {"kind": "Devices"}


@pytest.mark.parametrize("kind", CLIENTS)
async def test_a_header_line_past_the_bound_fails_the_call_as_a_transient_error(kind: str) -> None:
    """A header line over MAX_HEADER_LINE (http.client's own bound): both clients refuse the answer, as
    an error the reconcile retries (no answer was read)."""

    def handle(conn: Conn, served: Served) -> None:
        while conn.request() is not None:
            conn.answer(head=f"X-Long: {'a' * (wire.MAX_HEADER_LINE + 10)}\r\n")

    with raw_server(handle) as served:
        with pytest.raises(Exception) as refused:
            await send(kind, api_at(served.url), GET)
        assert transient(refused.value), repr(refused.value)
        assert not isinstance(refused.value, kubernetes.client.ApiException) or refused.value.status in (
            0,
            400,
        )


def test_the_bounds_are_what_the_module_says() -> None:
    assert wire.MAX_HEADER_LINE == 65536  # http.client's own
    import http.client

    assert http.client._MAXLINE == wire.MAX_HEADER_LINE
    assert http.client._MAXHEADERS == wire.MAX_HEADERS + 1  # its count takes the head's closing line in
    assert (
        not wire.too_large(None)
        and not wire.too_large(wire.MAX_ANSWER)
        and wire.too_large(wire.MAX_ANSWER + 1)
    )


# --- item: a proxy URL's user:password is sent by both clients ----------------------------------------

PROXY_USER, PROXY_PASSWORD = "us@er", "p:ss w%rd"
PROXY_BASIC = "Basic " + base64.b64encode(f"{PROXY_USER}:{PROXY_PASSWORD}".encode()).decode()
USER_AUTHORIZATION = {PROXY_BASIC}  # what the proxy takes


def auth_proxy(conn: Conn, served: Served) -> None:
    """An HTTP proxy that forwards nothing and asks for Basic credentials: 407 without them, else the
    target it was asked for and the Proxy-Authorization headers it got (to count them)."""
    while (head := conn.request()) is not None:
        lines = head.decode("latin-1").split("\r\n")
        got = [
            ln.split(":", 1)[1].strip() for ln in lines[1:] if ln.lower().startswith("proxy-authorization:")
        ]
        if got[:1] != [PROXY_BASIC] and not set(got) & USER_AUTHORIZATION:
            conn.answer(
                b"{}",
                status="407 Proxy Authentication Required",
                head='Proxy-Authenticate: Basic realm="p"\r\n',
            )
        else:
            conn.answer(json.dumps({"target": lines[0].split()[1], "auth": got}).encode())


def kubeconfig(tmp_path: pathlib.Path, proxy: str) -> pathlib.Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": "http://kube.invalid:6443", "proxy-url": proxy}}
                ],
                "users": [{"name": "u", "user": {"token": "t0ken"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


@pytest.mark.parametrize("kind", CLIENTS)
async def test_a_proxy_urls_user_and_password_are_sent_by_both_clients(
    kind: str, tmp_path: pathlib.Path
) -> None:
    """A kubeconfig's proxy-url with user:password (percent-encoded): the threaded client sent no
    Proxy-Authorization (urllib3 sends proxy_headers only) and the proxy refused it, where the loop's
    client (aiohttp) sent them. Both send it now, once, decoded as aiohttp and Go decode it."""
    with raw_server(auth_proxy) as proxy:
        host = proxy.url.removeprefix("http://")
        api = load_client(
            kubeconfig(
                tmp_path, f"http://{quote(PROXY_USER, safe='')}:{quote(PROXY_PASSWORD, safe='')}@{host}"
            )
        )
        (got,) = await send(kind, api, GET)
        assert json.loads(got) == {
            "target": "http://kube.invalid:6443/apis/x/v1/devices/n1",
            "auth": [PROXY_BASIC],
        }


@pytest.mark.parametrize("kind", CLIENTS)
async def test_a_proxy_password_outside_latin_1_is_sent_alike_by_both_clients(
    kind: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiohttp encodes a proxy URL's credentials in latin-1 only (a "€" failed every request); the
    header load_client made of them (UTF-8) is what both clients send, aiohttp's own left out."""
    basic = "Basic " + base64.b64encode("admin:pa€ss".encode()).decode()
    monkeypatch.setattr(f"{__name__}.USER_AUTHORIZATION", {basic})
    with raw_server(auth_proxy) as proxy:
        host = proxy.url.removeprefix("http://")
        api = load_client(kubeconfig(tmp_path, f"http://admin:{quote('pa€ss')}@{host}"))
        (got,) = await send(kind, api, GET)
        assert json.loads(got)["auth"] == [basic]


@pytest.mark.parametrize("kind", CLIENTS)
@pytest.mark.parametrize("password", ["pässé", "pä€", "a:b@c%d"])
async def test_a_proxy_password_is_sent_in_utf_8_as_kubectl_sends_it(
    kind: str, password: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """client-go (kubectl, reading the same kubeconfig) sends a proxy URL's credentials as their UTF-8
    bytes: a proxy that takes kubectl's takes both clients'. Encoded in latin-1 when they fit it (as
    aiohttp encodes them), an "é" was sent as another byte than kubectl sends, and the proxy refused
    it; a "€" beside it made it UTF-8 again."""
    basic = "Basic " + base64.b64encode(f"üser:{password}".encode()).decode()
    monkeypatch.setattr(f"{__name__}.USER_AUTHORIZATION", {basic})
    with raw_server(auth_proxy) as proxy:
        host = proxy.url.removeprefix("http://")
        api = load_client(kubeconfig(tmp_path, f"http://{quote('üser')}:{quote(password, safe='')}@{host}"))
        (got,) = await send(kind, api, GET)
        assert json.loads(got)["auth"] == [basic]


@pytest.mark.parametrize("kind", CLIENTS)
async def test_a_wrong_proxy_password_is_the_proxys_refusal(kind: str, tmp_path: pathlib.Path) -> None:
    with raw_server(auth_proxy) as proxy:
        host = proxy.url.removeprefix("http://")
        api = load_client(kubeconfig(tmp_path, f"http://{quote(PROXY_USER, safe='')}:wrong@{host}"))
        with pytest.raises(kubernetes.client.ApiException) as refused:
            await send(kind, api, GET)
        assert refused.value.status == 407


@pytest.mark.parametrize(
    ("proxy", "said"),
    [
        (None, None),
        ("", None),
        ("http://proxy:3128", None),
        ("socks5://u:p@proxy:1080", None),  # urllib3's SOCKS manager reads it from the URL itself
        ("http://u:p@proxy:3128", "Basic " + base64.b64encode(b"u:p").decode()),
        ("http://u@proxy:3128", "Basic " + base64.b64encode(b"u:").decode()),
        ("http://%C3%A9:%2F@proxy", "Basic " + base64.b64encode("é:/".encode()).decode()),  # as Go
        ("http://%E2%82%AC:x@proxy", "Basic " + base64.b64encode("€:x".encode()).decode()),  # not latin-1
        ("http://[::1:3128", None),  # refused by the client itself, by its own message
    ],
)
def test_the_proxy_authorization_of_a_proxy_url(proxy: str | None, said: str | None) -> None:
    assert proxy_authorization(proxy) == said


def test_a_proxy_authorization_in_the_configuration_is_kept(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = kubeconfig(tmp_path, "http://u:p@proxy.invalid:3128")
    api = load_client(path)
    assert api.configuration.proxy_headers == {
        "Proxy-Authorization": "Basic " + base64.b64encode(b"u:p").decode()
    }
    original = kubernetes.client.Configuration.__init__

    def with_header(self: kubernetes.client.Configuration, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)
        self.proxy_headers = {"proxy-authorization": "Bearer mine", "X-Other": "1"}

    monkeypatch.setattr(kubernetes.client.Configuration, "__init__", with_header)
    assert load_client(path).configuration.proxy_headers == {
        "proxy-authorization": "Bearer mine",
        "X-Other": "1",
    }


# --- item: a request whose connection closed with no answer is sent again only when that is harmless ----

MERGE = "application/merge-patch+json"
WRITES = {
    "merge patch": Request(
        "patch", "x", "PATCH", "/p", body={"metadata": {"labels": {"a": "1"}}}, content_type=MERGE
    ),
    "named create": Request("create", "x", "POST", "/c", body={"metadata": {"name": "n1"}}),
    "get": GET,
    "put": Request("replace", "x", "PUT", "/r", body={"metadata": {"name": "n1"}}),
}
NOT_TWICE = {
    "generated-name create": Request(
        "create", "events", "POST", "/e", body={"metadata": {"generateName": "n1-"}}
    ),
    "json patch": Request(
        "patch",
        "x",
        "PATCH",
        "/j",
        body=[{"op": "add", "path": "/a/-", "value": 1}],
        content_type="application/json-patch+json",
    ),
}


def closes_the_kept_alive_one(conn: Conn, served: Served) -> None:
    """The first connection's second request is read and the connection closed with no answer (a server
    timing the idle connection out as the request arrives, or dying on it); everything else answered."""
    while conn.request() is not None:
        if conn.number == 0 and len(conn.requests) == 2:
            return
        conn.answer()


def answers_once(conn: Conn, served: Served) -> None:
    """Only the first request of all is answered: every later one is read and its connection closed."""
    while conn.request() is not None:
        if sum(len(c.requests) for c in served.conns) > 1:
            return
        conn.answer()


def received(served: Served) -> list[list[str]]:
    return [[r.split(b" ", 2)[1].decode() for r in c.requests] for c in served.conns]


@pytest.mark.parametrize("kind", CLIENTS)
@pytest.mark.parametrize("what", list(WRITES))
async def test_a_request_safe_to_send_twice_is_sent_again_on_another_connection(kind: str, what: str) -> None:
    """A write the server may have dropped with its kept-alive connection, sent twice doing no harm (a
    merge patch, a create that names its object: a second one is refused AlreadyExists; a read, a PUT):
    sent once more on another connection and answered, no failure for the reconcile to retry."""
    request = WRITES[what]
    with raw_server(closes_the_kept_alive_one) as served:
        first, second = await send(kind, api_at(served.url), request, request)
        assert json.loads(first) == json.loads(second) == {"kind": "Devices"}
        path = request.path.format_map(request.params)
        assert received(served) == [[path, path], [path]]  # answered, dropped, sent again elsewhere


@pytest.mark.parametrize("kind", CLIENTS)
@pytest.mark.parametrize("what", list(NOT_TWICE))
async def test_a_create_with_a_generated_name_is_never_sent_twice(kind: str, what: str) -> None:
    """An Event's create (generateName) or a JSON patch (an "add" adds again) the server may have read
    before closing: sent again it could make a second Event. It fails (an error the callers retry as a
    broken connection: the Recorder logs and counts it); the server got it once."""
    request = NOT_TWICE[what]
    with raw_server(closes_the_kept_alive_one) as served:
        api = api_at(served.url)
        client = AsyncClient(api) if kind == "loop" else None
        try:
            if client is not None:
                await apicall.arun(one_call(request), client, Metrics())
                with pytest.raises(Exception) as failed:
                    await apicall.arun(one_call(request), client, Metrics())
            else:
                await asyncio.to_thread(apicall.run, one_call(request), api, Metrics())
                with pytest.raises(Exception) as failed:
                    await asyncio.to_thread(apicall.run, one_call(request), api, Metrics())
        finally:
            if client is not None:
                await client.close()
        assert transient(failed.value), repr(failed.value)
        await asyncio.sleep(0.1)
        assert received(served) == [[request.path, request.path]]


@pytest.mark.parametrize("kind", CLIENTS)
@pytest.mark.parametrize("what", ["merge patch", "get"])
async def test_a_request_is_sent_again_once_only(kind: str, what: str) -> None:
    """The server closing every connection with no answer: the second call is sent twice in all (once
    more, aiohttp's own resend of a GET included), then fails for the reconcile's backoff."""
    request = WRITES[what]
    with raw_server(answers_once) as served:
        with pytest.raises(Exception) as failed:
            await send(kind, api_at(served.url), request, request)
        assert transient(failed.value), repr(failed.value)
        await asyncio.sleep(0.1)
        assert sum(len(c) for c in received(served)) == 3


def closes_after_answering(conn: Conn, served: Served) -> None:
    """Answers one request per connection, kept alive by its headers, then closes it: a server whose idle
    timeout is shorter than the client's wait."""
    if conn.request() is not None:
        conn.answer()


@pytest.mark.parametrize("kind", CLIENTS)
@pytest.mark.parametrize("what", list(NOT_TWICE))
async def test_a_connection_found_closed_before_sending_is_not_used(kind: str, what: str) -> None:
    """The provable case: the server closed the kept-alive connection before the request went out. Each
    client finds it closed and sends on a new one: even a create with a generated name goes through,
    once."""
    request = NOT_TWICE[what]
    with raw_server(closes_after_answering) as served:
        api = api_at(served.url)
        client = AsyncClient(api) if kind == "loop" else None
        try:
            for _ in range(2):
                if client is not None:
                    await apicall.arun(one_call(request), client, Metrics())
                else:
                    await asyncio.to_thread(apicall.run, one_call(request), api, Metrics())
                await asyncio.sleep(0.2)  # the close arrives while the connection waits in the pool
        finally:
            if client is not None:
                await client.close()
        assert received(served) == [[request.path], [request.path]]


@pytest.mark.parametrize(
    ("method", "body", "content_type", "twice"),
    [
        ("GET", None, "application/json", True),
        ("delete", None, "application/json", True),
        ("PUT", {}, "application/json", True),
        ("PATCH", {}, "application/merge-patch+json", True),
        ("PATCH", {}, "application/strategic-merge-patch+json; charset=utf-8", True),
        ("PATCH", [], "application/json-patch+json", False),
        ("POST", {"metadata": {"name": "n1"}}, "application/json", True),
        ("POST", {"metadata": {"generateName": "n1-"}}, "application/json", False),
        ("POST", {"metadata": {"name": ""}}, "application/json", False),
        ("POST", {"metadata": {"name": 5}}, "application/json", False),
        ("POST", {"metadata": None}, "application/json", False),
        ("POST", [], "application/json", False),
        ("POST", None, "application/json", False),
        ("CONNECT", None, "application/json", False),
    ],
)
def test_which_requests_may_be_sent_twice(method: str, body: object, content_type: str, twice: bool) -> None:
    assert wire.resendable(method, body, content_type) is twice


def test_a_refused_credential_is_refreshed_and_sent_again_only_for_a_401_with_a_hook() -> None:
    assert wire.refresh_and_resend(401, True)
    assert not wire.refresh_and_resend(401, False)
    assert not any(wire.refresh_and_resend(s, True) for s in (0, 400, 403, 404, 407, 500))


CUT = {
    # Each an answer begun (its head, or what a server wrote in its place) and then the connection closed:
    # the request was read and answered, so it is no request "closed with no answer".
    "half a body": b'HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n{"kind":',
    "half a chunk": b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n28\r\n{"kind":',
    "a chunk size in garbage": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "no status line": b"garbage, not HTTP\r\n\r\n",
}


def cuts_the_second(cut: bytes) -> Callable[[Conn, Served], None]:
    """The first connection's second request answered with `cut`, then the connection closed."""

    def handle(conn: Conn, served: Served) -> None:
        while conn.request() is not None:
            if conn.number == 0 and len(conn.requests) == 2:
                conn.sock.sendall(cut)
                return
            conn.answer()

    return handle


@pytest.mark.parametrize("kind", CLIENTS)
@pytest.mark.parametrize("cut", list(CUT))
@pytest.mark.parametrize("what", ["merge patch", "named create"])
async def test_an_answer_cut_off_or_garbled_is_never_sent_again(kind: str, cut: str, what: str) -> None:
    """A request answered, the answer then cut off or garbled, was read and acted on: it is no connection
    closed with no answer, so neither client sends it again (a second status write would meet its own
    resourceVersion's 409 and be taken as superseded) nor parses what came; the call fails, transient."""
    request = WRITES[what]
    with raw_server(cuts_the_second(CUT[cut])) as served:
        with pytest.raises(Exception) as failed:
            await send(kind, api_at(served.url), request, request)
        assert transient(failed.value), repr(failed.value)
        await asyncio.sleep(0.1)
        assert received(served) == [[request.path, request.path]]  # never sent a third time


def interim_first(conn: Conn, served: Served) -> None:
    """The first request answered by an interim answer (103 Early Hints, as a proxy may send), then its
    answer; every later one answered as usual."""
    while conn.request() is not None:
        if len(conn.requests) == 1 and conn.number == 0:
            conn.sock.sendall(b"HTTP/1.1 103 Early Hints\r\nLink: </x>; rel=preload\r\n\r\n")
            conn.answer(b'{"kind":"First"}')
            continue
        conn.answer()


@pytest.mark.parametrize("kind", CLIENTS)
async def test_an_interim_answer_is_never_taken_for_the_answer_nor_leaves_it_for_the_next(kind: str) -> None:
    """A 1xx other than 100 ahead of the answer: aiohttp reads past it; http.client takes it for the
    answer (no body), leaving the real answer unread on the kept-alive connection, where the next
    request read it as its own. Either the first call gets its answer or it fails as a broken connection
    (transient); the next call gets its own answer, never the first's."""
    with raw_server(interim_first) as served:
        api = api_at(served.url)
        try:
            first: bytes | None = (await send(kind, api, GET))[0]
        except Exception as err:
            assert transient(err), repr(err)
            first = None
        assert first in (None, b'{"kind":"First"}')
        if kind == "loop":
            assert first is not None  # aiohttp reads past it
        (second,) = await send(kind, api, GET)
        assert json.loads(second) == {"kind": "Devices"}


async def _stopped_mid_write(
    kind: str,
    handle: Callable[[Conn, Served], None],
    hook: Callable[[object], None],
    reached: threading.Event,
    go: threading.Event,
) -> None:
    """A merge patch through the Driver (client `kind`, a bearer credential refreshed by `hook`) against
    `handle`, cancelled as the operator's stop cancels it once `reached` is set, then `go` set: the write
    ends cancelled, and the server received it once, nothing after the stop."""
    request = WRITES["merge patch"]
    with raw_server(handle) as served:
        api = api_at(served.url)
        api.configuration.api_key = {"authorization": "Bearer t"}
        api.configuration.refresh_api_key_hook = hook
        if kind == "thread":
            api.configuration.assert_hostname = "localhost"  # the Driver sends through the ApiClient
        driver = Driver(api, Metrics())
        assert (driver.client is None) is (kind == "thread")
        try:
            writing = asyncio.ensure_future(driver(one_call(request)))
            assert await asyncio.to_thread(reached.wait, 10)
            writing.cancel()  # the stop
            await asyncio.sleep(0.1)
            go.set()
            with pytest.raises(asyncio.CancelledError):
                await writing
            await asyncio.sleep(0.2)
            assert received(served) == [[request.path]]
        finally:
            go.set()
            await driver.close()


@pytest.mark.parametrize("kind", CLIENTS)
async def test_a_stop_that_comes_while_the_credential_is_refreshed_sends_nothing_more(kind: str) -> None:
    """The write is refused 401 and the refresh hook runs (an exec plugin's takes a while); the operator
    stops meanwhile: the refreshed credential is not used, nothing is sent after the stop (both
    clients: the stop is asked again once the hook has returned)."""
    refused, in_hook, go = threading.Event(), threading.Event(), threading.Event()

    def handle(conn: Conn, served: Served) -> None:
        while conn.request() is not None:
            refused.set()  # before the answer: the client's refresh may run before this thread goes on
            conn.answer(b'{"kind":"Status","code":401}', status="401 Unauthorized")

    def hook(config: object) -> None:
        if refused.is_set():  # the refresh the 401 asks for
            in_hook.set()
            go.wait(10)

    await _stopped_mid_write(kind, handle, hook, in_hook, go)  # the stop, while the hook runs


@pytest.mark.parametrize("kind", CLIENTS)
@pytest.mark.parametrize("refusal", ["closed", "401"])
async def test_a_request_in_flight_at_a_stop_is_not_sent_again_after_it(kind: str, refusal: str) -> None:
    """The operator stopping (its reconcile cancelled) while a request is in flight waits for it; the
    connection then closed with no answer (or a 401 that would refresh the credential): sent again, it
    would be a write made after the stop, perhaps once the lease is a standby's. It fails; nothing is
    sent after the stop."""
    got, go = threading.Event(), threading.Event()

    def handle(conn: Conn, served: Served) -> None:
        while conn.request() is not None:
            if conn.number == 0:
                got.set()
                go.wait(10)
                if refusal == "401":
                    conn.answer(b'{"kind":"Status","code":401}', status="401 Unauthorized")
                    continue
                return
            conn.answer()

    await _stopped_mid_write(kind, handle, lambda config: None, got, go)


@pytest.mark.parametrize("kind", CLIENTS)
@pytest.mark.parametrize("what", ["merge patch", "named create", "get"])
async def test_a_head_cut_off_is_never_an_empty_answer(kind: str, what: str) -> None:
    """The connection closed in the middle of the answer's head: http.client takes what came as the whole
    head (no length: a body up to the close, so none) and the call an empty 200, which every caller
    then fails to read as an object (not a transient error). Either the call fails as a broken
    connection (transient), or it is answered (the loop's client takes it for a close with no answer
    and sends it once more); never an empty answer."""
    request = WRITES[what]
    with raw_server(cuts_the_second(b"HTTP/1.1 200 OK\r\nContent-Type: appl")) as served:
        api = api_at(served.url)
        try:
            answers = await send(kind, api, request, request)
        except Exception as err:
            assert transient(err), repr(err)
        else:
            assert [json.loads(a) for a in answers] == [{"kind": "Devices"}] * 2


@pytest.mark.parametrize("kind", CLIENTS)
@pytest.mark.parametrize("length", ["1 0", "ten", "-1", "0x10", ""])
async def test_a_content_length_that_is_no_number_is_refused_at_once(kind: str, length: str) -> None:
    """A Content-Length that is no length (spaces inside, a word, a negative): aiohttp refuses the head;
    http.client made no length of it and read up to a close that a kept-alive connection never makes,
    holding the call for the whole read timeout (60 s). Both refuse it at once, as a broken answer
    (transient), and the next call is answered."""

    def handle(conn: Conn, served: Served) -> None:
        while conn.request() is not None:
            if conn.number == 0:
                conn.sock.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {length}\r\n\r\n{{}}".encode())
                continue
            conn.answer()

    with raw_server(handle) as served:
        api = api_at(served.url)
        with pytest.raises(Exception) as refused:
            await asyncio.wait_for(send(kind, api, GET), 10)
        assert not isinstance(refused.value, TimeoutError) and transient(refused.value), repr(refused.value)
        (again,) = await send(kind, api, GET)
        assert json.loads(again) == {"kind": "Devices"}


@pytest.mark.parametrize("kind", CLIENTS)
async def test_both_clients_take_as_many_headers_and_refuse_one_more(kind: str) -> None:
    """An answer of wire.MAX_HEADERS header lines is read by both clients; one more is refused by both
    (transient): http.client refused past 99 where aiohttp read up to 128, so one client failed every
    write (retried for ever) that the other sent."""

    def headers(count: int) -> Callable[[Conn, Served], None]:
        def handle(conn: Conn, served: Served) -> None:
            while conn.request() is not None:  # conn.answer says two itself
                conn.answer(head="".join(f"X-H{i}: v\r\n" for i in range(count - 2)))

        return handle

    with raw_server(headers(wire.MAX_HEADERS)) as served:
        (got,) = await send(kind, api_at(served.url), GET)
        assert json.loads(got) == {"kind": "Devices"}
    with raw_server(headers(wire.MAX_HEADERS + 1)) as served:
        with pytest.raises(Exception) as refused:
            await send(kind, api_at(served.url), GET)
        assert transient(refused.value), repr(refused.value)
