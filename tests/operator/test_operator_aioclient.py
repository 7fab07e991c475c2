"""The operator's writes on its event loop (apicall.arun through aioclient.AsyncClient): real HTTP, against
the embedded API and against small scripted servers for what the embedded API does not do (hold an
answer, never answer, act as a proxy). What each answer becomes must be what the kubernetes client in a
worker thread (apicall.run) makes of it, since every caller's handling is written against that."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import pathlib
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import kubernetes
import pytest
from operator_harness import NF, NS, Client, eventually, running_operator, settle
from operator_records import devices, gpu, group, nic, nvlink

from nodefabric_devicemanager import crd, models
from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_operator import apicall, labels, noderecord, rawcall, sinks
from nodefabric_operator.aioclient import AsyncClient, Driver, tls_context
from nodefabric_operator.apicall import Calls, Request
from nodefabric_operator.demo.kubeapi import running_api
from nodefabric_operator.metrics import Metrics
from nodefabric_operator.reconcile import Reconciler, transient

NF_PATH = sinks.NFD_PATH
CAPABLE = "feature.gpustack.ai/rdma.capable"


def gpu_node(name: str) -> models.Devices:
    return devices(name, interfaces=[nic()], groups=[group("nvidia", gpu(0, fabric=nvlink()))])


def nodefeature(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "nfd.k8s-sigs.io/v1alpha1",
        "kind": "NodeFeature",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"labels": labels or {}},
    }


def one(request: Request) -> Calls[bytes]:
    return (yield request)


def api_at(url: str, **settings: Any) -> kubernetes.client.ApiClient:
    config = kubernetes.client.Configuration()
    config.host = url
    for key, value in settings.items():
        setattr(config, key, value)
    return kubernetes.client.ApiClient(config)


class Scripted(http.server.BaseHTTPRequestHandler):
    """A server in a thread of its own (so a test may cancel every task of its own loop, as kopf does
    when it stops): records each request, holds its answer while `hold` is clear, answers
    `answer(handler)` (status, body) or, with `silent`, never."""

    seen: list[tuple[str, str, dict[str, str], bytes]]
    answered: list[str]
    hold: threading.Event
    silent: bool
    answer: Callable[[Scripted], tuple[int, bytes]]

    def _any(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(size) if size else b""
        self.seen.append((self.command, self.path, dict(self.headers), body))
        if self.silent:
            time.sleep(30)
            return
        assert self.hold.wait(30)
        status, data = type(self).answer(self)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        # Noted before the body goes out: a client holding the whole answer finds it noted (noted after,
        # the test could look before the server's thread got there).
        self.answered.append(self.path)
        self.wfile.write(data)

    do_GET = do_POST = do_PATCH = _any

    def log_message(self, *args: object) -> None:
        return None


@contextlib.contextmanager
def scripted(
    answer: Callable[[Scripted], tuple[int, bytes]] = lambda _: (200, b"{}"), *, silent: bool = False
) -> Iterator[tuple[str, type[Scripted]]]:
    handler = type(
        "Handler",
        (Scripted,),
        {"seen": [], "answered": [], "hold": threading.Event(), "silent": silent, "answer": answer},
    )
    handler.hold.set()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        handler.hold.set()
        server.shutdown()
        server.server_close()


def refused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: nothing listens there


# --- what an answer becomes ---------------------------------------------------------------------------


async def test_refusals_are_raised_as_the_kubernetes_client_raises_them() -> None:
    """404, 409 and 422 from the embedded API: the loop's client raises the same per-status ApiException
    subclass, with the same status, reason and body, as the client in a thread."""
    async with running_api([crd.devices_crd()]) as k:
        k.api.put_object("v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        api = load_client(k.kubeconfig)
        client = AsyncClient(api)
        metrics = Metrics()
        created = Request("create", sinks.NFD_PLURAL, "POST", NF_PATH, {"ns": NS}, nodefeature("n1"))
        await apicall.arun(one(created), client, metrics)
        requests = {
            404: Request("get", sinks.NFD_PLURAL, "GET", sinks.NFD_OBJECT, {"ns": NS, "name": "none"}),
            409: created,  # AlreadyExists
            422: Request("create", sinks.NFD_PLURAL, "POST", NF_PATH, {"ns": NS}, nodefeature("Not_A_Name")),
        }
        try:
            for status, request in requests.items():
                with pytest.raises(kubernetes.client.ApiException) as on_loop:
                    await apicall.arun(one(request), client, metrics)
                with pytest.raises(kubernetes.client.ApiException) as in_thread:
                    await asyncio.to_thread(apicall.run, one(request), api, metrics)
                got, want = on_loop.value, in_thread.value
                assert (type(got), got.status, got.reason) == (type(want), want.status, want.reason)
                assert got.status == status and rawcall.status_of(got) == status
                said = json.loads(got.body)
                assert said["code"] == status and said == json.loads(want.body)
                assert got.headers is not None and "json" in got.headers["Content-Type"]
            # Each request counted once, whichever client sent it.
            assert metrics.api_requests.labels(verb="create", resource=sinks.NFD_PLURAL)._value.get() == 5
        finally:
            await client.close()
            api.close()


async def test_a_refusal_is_thrown_into_the_requests_where_they_yielded() -> None:
    """The caller's handling runs where the request was made: a 404 caught there ends the calls with
    the caller's own answer; what is not caught comes out of arun."""

    def tolerant() -> Calls[str]:
        try:
            yield Request("get", "x", "GET", "/missing")
        except kubernetes.client.ApiException as err:
            return f"handled {err.status}"
        return "found"

    with scripted(lambda h: (404, b'{"code":404}') if h.path == "/missing" else (200, b"{}")) as (url, _):
        client = AsyncClient(api_at(url))
        try:
            assert await apicall.arun(tolerant(), client, Metrics()) == "handled 404"
            with pytest.raises(kubernetes.client.exceptions.NotFoundException):
                await apicall.arun(one(Request("get", "x", "GET", "/missing")), client, Metrics())
        finally:
            await client.close()


async def test_a_token_refused_within_the_refresh_interval_is_refreshed_and_sent_again(
    tmp_path: pathlib.Path,
) -> None:
    """As rawcall.send: the refresh hook runs at most once a second, at once after a 401, and the request
    is sent once more; a credential the refresh does not cure is refused after that one retry."""
    token = tmp_path / "token"
    token.write_text("first")
    valid = {"token": "first"}

    def answer(h: Scripted) -> tuple[int, bytes]:
        ok = h.headers.get("authorization") == f"Bearer {valid['token']}"
        return (200, b'{"ok":true}') if ok else (401, b'{"kind":"Status","code":401}')

    hooked: list[str] = []

    def refresh(conf: kubernetes.client.Configuration) -> None:
        hooked.append(threading.current_thread().name)
        conf.api_key["authorization"] = "Bearer " + token.read_text()

    with scripted(answer) as (url, server):
        api = api_at(url, api_key={"authorization": "Bearer first"}, refresh_api_key_hook=refresh)
        client = AsyncClient(api)
        try:
            get = Request("get", "x", "GET", "/api")
            assert await apicall.arun(one(get), client, Metrics()) == b'{"ok":true}'
            token.write_text("second")
            valid["token"] = "second"
            assert await apicall.arun(one(get), client, Metrics()) == b'{"ok":true}'
            assert [s[2].get("authorization") for s in server.seen[-2:]] == ["Bearer first", "Bearer second"]
            valid["token"] = "third"
            before = len(server.seen)
            with pytest.raises(kubernetes.client.exceptions.UnauthorizedException):
                await apicall.arun(one(get), client, Metrics())
            assert len(server.seen) - before == 2  # sent, refreshed, sent once more: no loop
            # The hook reads a file (or runs an exec plugin): never on the event loop's thread.
            assert hooked and threading.main_thread().name not in hooked
        finally:
            await client.close()


# --- TLS, proxy, and what is left to the threaded client ----------------------------------------------


async def test_tls_and_a_bearer_token_come_from_the_kubeconfig() -> None:
    """An API server over https that wants a token: the kubeconfig's CA and token are what the loop's
    client uses; without the CA the certificate is refused (a transient failure, as urllib3's)."""
    async with running_api([crd.devices_crd()], tls=True, token="s3cret") as k:
        api = load_client(k.kubeconfig)
        assert api.configuration.host.startswith("https://")
        client = AsyncClient(api)
        untrusting = AsyncClient(api_at(api.configuration.host, api_key=api.configuration.api_key))
        unverified = AsyncClient(
            api_at(api.configuration.host, api_key=api.configuration.api_key, verify_ssl=False)
        )
        tokenless = AsyncClient(api_at(api.configuration.host, ssl_ca_cert=api.configuration.ssl_ca_cert))
        get = Request("get", "x", "GET", "/api/v1/nodes")
        try:
            assert "items" in json.loads(await apicall.arun(one(get), client, Metrics()))
            with pytest.raises(aiohttp.ClientConnectorCertificateError) as untrusted:
                await apicall.arun(one(get), untrusting, Metrics())
            assert transient(untrusted.value)
            assert "items" in json.loads(await apicall.arun(one(get), unverified, Metrics()))
            with pytest.raises(kubernetes.client.exceptions.UnauthorizedException):
                await apicall.arun(one(get), tokenless, Metrics())
        finally:
            for c in (client, untrusting, unverified, tokenless):
                await c.close()


async def test_the_tls_server_name_is_the_name_checked_against_the_certificate() -> None:
    """`tls_server_name` (a kubeconfig's `tls-server-name`): the certificate is checked against that name,
    not the address connected to."""
    async with running_api([crd.devices_crd()], tls=True) as k:
        api = load_client(k.kubeconfig)
        config = api.configuration
        named = AsyncClient(
            api_at(
                config.host,
                api_key=config.api_key,
                ssl_ca_cert=config.ssl_ca_cert,
                tls_server_name="localhost",
            )
        )
        misnamed = AsyncClient(
            api_at(
                config.host,
                api_key=config.api_key,
                ssl_ca_cert=config.ssl_ca_cert,
                tls_server_name="kube.example",
            )
        )
        get = Request("get", "x", "GET", "/api/v1/nodes")
        try:
            assert "items" in json.loads(await apicall.arun(one(get), named, Metrics()))
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await apicall.arun(one(get), misnamed, Metrics())
        finally:
            await named.close()
            await misnamed.close()


def test_the_tls_settings_follow_the_configuration() -> None:
    plain = kubernetes.client.Configuration()
    plain.host = "http://127.0.0.1:1"
    assert tls_context(plain) is True  # no TLS to set up
    config = kubernetes.client.Configuration()
    config.host = "https://kube.example:6443"
    checked = tls_context(config)
    assert isinstance(checked, ssl.SSLContext)
    assert (checked.verify_mode, checked.check_hostname) == (ssl.CERT_REQUIRED, True)
    config.verify_ssl = False
    loose = tls_context(config)
    assert isinstance(loose, ssl.SSLContext)
    assert (loose.verify_mode, loose.check_hostname) == (ssl.CERT_NONE, False)


async def test_an_http_proxy_in_the_configuration_carries_the_request() -> None:
    with scripted(lambda _: (200, b'{"via":"proxy"}')) as (proxy, server):
        api = api_at(
            "http://kube.invalid:6443", proxy=proxy, proxy_headers={"Proxy-Authorization": "Basic eDp5"}
        )
        client = AsyncClient(api)
        try:
            answer = await apicall.arun(one(Request("get", "x", "GET", "/api")), client, Metrics())
            assert json.loads(answer) == {"via": "proxy"}
            (method, target, headers, _), *_ = server.seen
            assert (method, target) == ("GET", "http://kube.invalid:6443/api")
            assert headers.get("Proxy-Authorization") == "Basic eDp5"
        finally:
            await client.close()


@pytest.mark.parametrize(
    "setting",
    [
        {"proxy": "socks5://127.0.0.1:1080"},
        {"assert_hostname": "kube.example"},
        {"socket_options": [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]},
        {"keep_alive": True},  # the client's own TCP keepalive socket options
    ],
)
def test_a_configuration_the_loops_client_cannot_reproduce_is_left_to_the_threaded_one(setting) -> None:
    config = kubernetes.client.Configuration()
    config.host = "https://kube.example:6443"
    assert AsyncClient.serves(config)
    assert Driver(kubernetes.client.ApiClient(config), Metrics()).client is not None
    for key, value in setting.items():
        setattr(config, key, value)
    assert not AsyncClient.serves(config)


async def test_the_threaded_fallback_publishes_as_before() -> None:
    """A Driver without the loop's client (a configuration it cannot reproduce) sends the same requests
    through the kubernetes client in a worker thread."""
    async with running_api([crd.devices_crd()]) as k:
        k.api.put_object("v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        api = load_client(k.kubeconfig)
        api.configuration.assert_hostname = "localhost"  # not reproduced by aiohttp (plain http here)
        driver = Driver(api, Metrics())
        assert driver.client is None
        created = Request("create", sinks.NFD_PLURAL, "POST", NF_PATH, {"ns": NS}, nodefeature("n1"))
        assert json.loads(await driver(one(created)))["metadata"]["name"] == "n1"
        assert k.api.stored(NF, "n1", NS) is not None
        await driver.close()
        api.close()


# --- no answer: refused, hung, and a stop while a write is in flight ----------------------------------


async def test_a_refused_connection_is_a_transient_failure() -> None:
    client = AsyncClient(api_at(f"http://127.0.0.1:{refused_port()}"))
    try:
        with pytest.raises(aiohttp.ClientConnectorError) as refused:
            await apicall.arun(one(Request("get", "x", "GET", "/api")), client, Metrics())
        assert transient(refused.value)
    finally:
        await client.close()


async def test_a_hung_api_server_fails_the_write_within_the_timeout() -> None:
    """An API server that takes the request and never answers: the write fails (transient: retried with
    backoff) once the timeout passes, instead of holding its record, and a stop, for ever."""
    with scripted(silent=True) as (url, server):
        client = AsyncClient(api_at(url), timeout=0.5)
        try:
            started = time.monotonic()
            with pytest.raises(TimeoutError) as hung:
                await apicall.arun(one(Request("patch", "x", "PATCH", "/hung", body={})), client, Metrics())
            assert 0.4 < time.monotonic() - started < 10
            assert transient(hung.value) and len(server.seen) == 1
        finally:
            await client.close()


async def test_an_answer_trickled_byte_by_byte_fails_the_write_within_a_bound() -> None:
    """A server (or a proxy) that sends a byte of its answer before each read timeout passes: the timeout
    between reads never fires, so without a bound on the whole request the write, and a stop waiting for
    it, is held for as long as the server likes."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def trickle() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            body = b'{"metadata":{"name":"slow-answer"}}'
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
            conn.sendall(b"Content-Length: %d\r\n\r\n" % len(body))
            for byte in body:
                if stop.wait(0.2):
                    return
                conn.sendall(bytes([byte]))

    threading.Thread(target=trickle, daemon=True).start()
    client = AsyncClient(api_at(f"http://127.0.0.1:{listener.getsockname()[1]}"), timeout=0.5)
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError) as slow:
            await apicall.arun(one(Request("patch", "x", "PATCH", "/slow", body={})), client, Metrics())
        assert time.monotonic() - started < 3  # the whole answer would take 7 s
        assert transient(slow.value)
    finally:
        stop.set()
        await client.close()
        listener.close()


async def test_a_token_refresh_that_never_returns_fails_the_write_within_the_timeout() -> None:
    """The refresh hook (an exec plugin: a subprocess with no timeout of its own) hangs: the write fails,
    transient, once the request's timeout passes, instead of holding its record and a stop."""
    release = threading.Event()
    with scripted() as (url, server):
        api = api_at(
            url,
            api_key={"BearerToken": "t0"},
            api_key_prefix={"BearerToken": "Bearer"},
            refresh_api_key_hook=lambda config: release.wait(30),
        )
        rawcall._refreshed.pop(api.configuration, None)
        client = AsyncClient(api, timeout=0.3)
        try:
            started = time.monotonic()
            with pytest.raises(TimeoutError) as hung:
                await apicall.arun(one(Request("get", "x", "GET", "/api")), client, Metrics())
            assert time.monotonic() - started < 5 and transient(hung.value)
            assert server.seen == []
        finally:
            release.set()
            await client.close()


async def test_writes_queued_for_a_connection_are_not_timed_out_while_they_wait() -> None:
    """The bound on a whole request starts once it has a connection: a first sync queues many writes on
    the pool (its size from the configuration), and a slow API server makes the queue long; a write that
    only waited for its turn must not fail (each retry would add to the queue)."""

    def slow(handler: Scripted) -> tuple[int, bytes]:
        time.sleep(0.3)
        return 200, b"{}"

    with scripted(slow) as (url, _):
        client = AsyncClient(api_at(url, connection_pool_maxsize=1), timeout=0.5)
        try:
            sends = [
                apicall.arun(one(Request("patch", "x", "PATCH", f"/n{i}", body={})), client, Metrics())
                for i in range(5)
            ]
            assert await asyncio.gather(*sends) == [b"{}"] * 5  # the last waited 1.2 s > 2 x 0.5 s
        finally:
            await client.close()


async def test_a_stop_sends_none_of_the_writes_still_waiting_for_a_connection() -> None:
    """Writes queued behind the pool's connections at a stop have sent nothing: they are dropped, not
    sent once a connection frees up (only the ones in flight are waited for)."""
    with scripted() as (url, server):
        server.hold.clear()
        client = AsyncClient(api_at(url, connection_pool_maxsize=1))
        writes = [
            asyncio.ensure_future(
                apicall.arun(one(Request("patch", "x", "PATCH", f"/n{i}", body={})), client, Metrics())
            )
            for i in range(3)
        ]
        try:
            deadline = time.monotonic() + 10
            while not server.seen and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)
            assert [s[1] for s in server.seen] == ["/n0"]
            for _ in range(2):  # the lanes' cancel, then kopf's sweep
                for write in writes:
                    write.cancel()
                await asyncio.sleep(0.05)
            assert not writes[0].done()  # in flight: waited for
            server.hold.set()
            ends = await asyncio.gather(*writes, return_exceptions=True)
            assert all(isinstance(end, asyncio.CancelledError) for end in ends), ends
            await asyncio.sleep(0.3)
            assert [s[1] for s in server.seen] == ["/n0"] and server.answered == ["/n0"]
        finally:
            server.hold.set()
            await client.close()


async def test_a_stop_while_a_write_is_in_flight_waits_for_its_answer_and_sends_nothing_after() -> None:
    """kopf, stopping, cancels the reconcile and then every task of its loop (the request's own too). The
    request sent is answered, not cut off; the cancel is raised after it; the next request of the same
    publish is never sent."""
    with scripted() as (url, server):
        server.hold.clear()
        client = AsyncClient(api_at(url))
        after: list[str] = []

        def two() -> Calls[None]:
            yield Request("create", "x", "POST", "/first", body={})
            after.append("answered")
            yield Request("patch", "x", "PATCH", "/second", body={})

        try:
            writing = asyncio.ensure_future(apicall.arun(two(), client, Metrics()))
            deadline = time.monotonic() + 10
            while not server.seen and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert [s[1] for s in server.seen] == ["/first"]
            for task in asyncio.all_tasks():  # kopf's sweep at stop
                if task is not asyncio.current_task():
                    task.cancel()
            await asyncio.sleep(0.3)
            assert not writing.done()  # waiting for the answer
            server.hold.set()
            with pytest.raises(asyncio.CancelledError):
                await writing
            assert server.answered == ["/first"]  # its answer was read...
            assert [s[1] for s in server.seen] == ["/first"] and after == []  # ...and nothing sent after
            await asyncio.sleep(0.2)
            assert [s[1] for s in server.seen] == ["/first"]
        finally:
            await client.close()


@pytest.mark.parametrize("threaded", [False, True])
async def test_a_stop_cancelling_twice_still_waits_for_the_write_in_flight(threaded: bool) -> None:
    """A stop cancels a reconcile more than once: the lanes cancel the one in hand and wait for it, and
    kopf's sweep cancels every task again (that wait's among them, which gather passes on to the lane).
    A second cancel must not end the wait for the answer: the stop would go on, closing the connections
    and releasing the lease, while the write is still on its way."""
    with scripted() as (url, server):
        server.hold.clear()
        driver = Driver(api_at(url, **({"assert_hostname": "localhost"} if threaded else {})), Metrics())
        assert (driver.client is None) is threaded
        writing = asyncio.ensure_future(driver(one(Request("create", "x", "POST", "/first", body={}))))
        deadline = time.monotonic() + 10
        while not server.seen and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for _ in range(3):  # the lane's cancel, then the sweep's, then a hung-task sweep's
            writing.cancel()
            await asyncio.sleep(0.1)
        assert not writing.done()  # still waiting for the answer
        server.hold.set()
        with pytest.raises(asyncio.CancelledError):
            await writing
        assert server.answered == ["/first"]
        await driver.close()


async def test_a_hung_api_server_does_not_hold_a_stop_in_the_threaded_fallback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The threaded client bounds a request as the loop's does (to connect, and between two reads): a
    stop waits for the write in flight through every cancel, so an API server that never answers would
    otherwise hold it for ever."""
    monkeypatch.setattr(rawcall, "REQUEST_TIMEOUT_S", 0.5)
    with scripted(silent=True) as (url, server):
        driver = Driver(api_at(url, assert_hostname="localhost", retries=0), Metrics())
        assert driver.client is None
        started = time.monotonic()
        with pytest.raises(Exception) as hung:
            await driver(one(Request("patch", "x", "PATCH", "/hung", body={})))
        assert transient(hung.value) and time.monotonic() - started < 10
        writing = asyncio.ensure_future(driver(one(Request("patch", "x", "PATCH", "/hung", body={}))))
        while len(server.seen) < 2 and time.monotonic() - started < 10:
            await asyncio.sleep(0.01)
        for _ in range(3):
            writing.cancel()
            await asyncio.sleep(0.05)
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(writing, 10)
        await driver.close()


async def test_a_stop_in_the_threaded_fallback_sends_nothing_after_the_request_in_flight() -> None:
    """The same promise when the writes go through the kubernetes client in a thread (a configuration
    the loop's client cannot reproduce): the request in flight is answered, the next one of the same
    publish is never sent, though the thread runs on after the cancel."""
    with scripted() as (url, server):
        server.hold.clear()
        driver = Driver(api_at(url, assert_hostname="localhost"), Metrics())
        assert driver.client is None
        after: list[str] = []

        def two() -> Calls[None]:
            yield Request("create", "x", "POST", "/first", body={})
            after.append("answered")
            yield Request("patch", "x", "PATCH", "/second", body={})

        writing = asyncio.ensure_future(driver(two()))
        deadline = time.monotonic() + 10
        while not server.seen and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert [s[1] for s in server.seen] == ["/first"]
        writing.cancel()
        await asyncio.sleep(0.3)
        assert not writing.done()  # waiting for the answer
        server.hold.set()
        with pytest.raises(asyncio.CancelledError):
            await writing
        await asyncio.sleep(0.3)
        assert server.answered == ["/first"]
        assert [s[1] for s in server.seen] == ["/first"] and after == []
        await driver.close()


async def test_a_request_is_cut_by_its_own_timeout_never_by_another_tasks_cancel() -> None:
    """The guard that keeps kopf's sweep off a request in flight leaves the request's own timeouts
    working (asyncio's and aiohttp's connect timeout cancel the task from a loop callback)."""

    async def slow(seconds: float) -> bytes:
        await asyncio.sleep(seconds)
        return b"{}"

    async def timed(seconds: float) -> bytes:
        async with asyncio.timeout(0.05):
            return await slow(seconds)

    with pytest.raises(TimeoutError):
        await apicall.Landing(timed(5))
    landing = apicall.Landing(slow(0.2))
    await asyncio.sleep(0)
    assert landing.cancel() is False  # from this test's task: refused
    assert await landing == b"{}"


def test_a_request_left_in_flight_when_the_loop_stops_is_cancelled_by_asyncio_run() -> None:
    """asyncio.run cancels the tasks left once its coroutine ended (the operator failed with a write in
    flight) with the loop no longer running, where asyncio.current_task() raises: the guard raised
    RuntimeError("no running event loop") out of asyncio.run, in place of the failure that ended it."""
    left: list[apicall.Landing] = []

    async def main() -> None:
        left.append(apicall.Landing(asyncio.sleep(60, b"{}")))
        await asyncio.sleep(0)

    asyncio.run(main())
    assert left[0].cancelled()


# --- the operator's own path --------------------------------------------------------------------------


async def test_a_first_publication_on_the_loop_is_two_requests_counted_once_each() -> None:
    """The reconciler publishes through the loop's client (the configuration allows it): the NodeFeature
    created and the status written, two requests and nothing else, each counted in the request metric."""
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n1")
        await c.put_devices(gpu_node("n1"))
        api = load_client(k.kubeconfig)
        metrics = Metrics()
        rec = Reconciler(api, sinks.NodeFeatureSink(api, NS, labels.DEFAULT_DOMAIN, metrics), metrics=metrics)
        assert rec.status.send.client is not None
        body = await c.devices("n1")
        before = k.count()
        try:
            assert (await rec.devices_event(body)).outcome == "published"
        finally:
            await rec.aclose()
            api.close()
        assert k.count() - before == 2
        assert len(k.requests("POST", NF)) == 1
        assert (await c.devices("n1"))["status"]["labels"][CAPABLE] == "true"
        counted = {
            (s.labels["verb"], s.labels["resource"]): s.value
            for m in metrics.api_requests.collect()
            for s in m.samples
        }
        assert counted == {("create", sinks.NFD_PLURAL): 1, ("patch", "devices/status"): 1}


@pytest.mark.parametrize("sink", ["nodefeature", "node"])
async def test_the_operator_publishes_over_tls_with_a_token(sink: str) -> None:
    async with running_api([crd.devices_crd()], tls=True, token="s3cret") as k:
        c = Client(k.kubeconfig)
        await c.node("n1")
        await c.put_devices(gpu_node("n1"))
        async with running_operator(k, sink=sink):

            async def published() -> bool:
                if sink == "node":
                    return (await c.node_labels("n1")).get(CAPABLE) == "true"
                nf = await c.nodefeature("n1")
                return nf is not None and nf["spec"]["labels"].get(CAPABLE) == "true"

            assert await eventually(published)
            await settle(k)


# --- the same answers, the same outcome from both drivers ---------------------------------------------


def _reads_object(request: Request) -> Calls[tuple[str, Any]]:
    try:
        answer = yield request
    except kubernetes.client.ApiException as err:
        return "refused", (type(err).__name__, err.status)
    return "object", rawcall.json_object(answer)


ANSWERS: dict[str, tuple[int, bytes]] = {
    "an object": (200, b'{"kind":"NodeFeature"}'),
    "not JSON on 200": (200, b"<html>proxy login</html>"),
    "a JSON list": (200, b"[1,2]"),
    "an empty 200": (200, b""),
    "an empty 204": (204, b""),
    "503": (503, b'{"kind":"Status","code":503}'),
    "429": (429, b'{"kind":"Status","code":429}'),
    "401 every time": (401, b'{"kind":"Status","code":401}'),
}


@pytest.mark.parametrize("answer", list(ANSWERS))
async def test_both_drivers_make_the_same_of_the_same_answer(answer: str) -> None:
    """Differential: each answer an API server (or a proxy in front of it) may give, sent through the
    loop's client and through the kubernetes client in a thread, ends the same way (value or exception
    type and status) after the same number of requests (a 401 refreshed and sent once more, no more)."""
    status, data = ANSWERS[answer]

    def reply(handler: Scripted) -> tuple[int, bytes]:
        return status, data

    with scripted(reply) as (url, server):
        ends: dict[str, tuple[Any, int]] = {}
        refreshed: list[str] = []
        api = api_at(
            url,
            api_key={"BearerToken": "t0"},
            api_key_prefix={"BearerToken": "Bearer"},
            refresh_api_key_hook=lambda config: refreshed.append("hook"),
            retries=0,  # as load_client configures it
        )
        request = Request("create", "x", "POST", "/things", body={"a": 1})
        client = AsyncClient(api)
        try:
            for name in ("loop", "thread"):
                rawcall._refreshed.clear()  # each driver starts with the refresh not yet due
                before = len(server.seen)
                try:
                    if name == "loop":
                        end: Any = await apicall.arun(_reads_object(request), client, Metrics())
                    else:
                        end = await asyncio.to_thread(apicall.run, _reads_object(request), api, Metrics())
                except Exception as err:
                    end = ("raised", type(err).__name__)
                ends[name] = (end, len(server.seen) - before)
        finally:
            await client.close()
        assert ends["loop"] == ends["thread"], ends
        assert ends["loop"][1] == (2 if status == 401 else 1)
        tokens = [{k.lower(): v for k, v in seen[2].items()}.get("authorization") for seen in server.seen]
        assert tokens and set(tokens) == {"Bearer t0"}


@pytest.mark.parametrize("token", ["s3cret\n", "s3cret\r\nX-Injected: 1", "s3c\x00ret"])
async def test_a_token_with_a_line_break_is_refused_clearly_and_never_quoted(token: str) -> None:
    """A token that cannot go in a header (a token file ending in a newline, or worse): nothing is sent,
    by either driver, and the error says what is wrong without quoting the token (the threaded client's
    own refusal quoted the whole header), and the status condition names it."""
    with scripted() as (url, server):
        api = api_at(url, api_key={"BearerToken": token}, api_key_prefix={"BearerToken": "Bearer"})
        client = AsyncClient(api)
        request = Request("patch", "x", "PATCH", "/p", body={})
        failures: list[BaseException] = []
        try:
            for send in (
                lambda: apicall.arun(one(request), client, Metrics()),
                lambda: asyncio.to_thread(apicall.run, one(request), api, Metrics()),
            ):
                with pytest.raises(rawcall.UnusableCredential) as refused:
                    await send()
                failures.append(refused.value)
        finally:
            await client.close()
        assert server.seen == []
        for err in failures:
            assert "s3c" not in str(err) and "line break" in str(err)
            assert not transient(err)
            assert "UnusableCredential" in noderecord.failure_condition("nodefeature", err).message


@pytest.mark.parametrize("status", [301, 302, 307, 308])
async def test_a_redirect_is_not_followed_and_is_retried_later(status: int) -> None:
    """An API server never redirects; a proxy or load balancer in front of it (misconfigured, or not
    ours) may. The operator's client configuration (load_client: no urllib3 retries) never followed a
    redirect: the write failed, transient. The loop's client must not follow it either: the write's body
    (labels, status) would go to another host, and that host's answer would be taken for the API
    server's. Both drivers: nothing reaches the other host, and the failure is retried."""
    with scripted() as (elsewhere, other):
        listener = socket.create_server(("127.0.0.1", 0))

        def redirect() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                with conn:
                    conn.recv(65536)
                    conn.sendall(
                        b"HTTP/1.1 %d Moved\r\nLocation: %s/stolen\r\n" % (status, elsewhere.encode())
                        + b"Content-Length: 0\r\nConnection: close\r\n\r\n"
                    )

        threading.Thread(target=redirect, daemon=True).start()
        api = api_at(
            f"http://127.0.0.1:{listener.getsockname()[1]}",
            api_key={"BearerToken": "s3cret"},
            api_key_prefix={"BearerToken": "Bearer"},
            retries=0,  # as load_client configures it
        )
        client = AsyncClient(api)
        request = Request("patch", "x", "PATCH", "/p", body={"a": 1})
        failures: list[BaseException] = []
        try:
            for send in (
                lambda: apicall.arun(one(request), client, Metrics()),
                lambda: asyncio.to_thread(apicall.run, one(request), api, Metrics()),
            ):
                with pytest.raises(Exception) as failed:
                    await send()
                failures.append(failed.value)
        finally:
            await client.close()
            listener.close()
        assert other.seen == []
        assert all(transient(err) for err in failures), failures
        assert rawcall.status_of(failures[0]) == status  # the loop's: "HTTP 307 ..." in the condition
