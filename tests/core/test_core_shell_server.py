"""The one metrics and probe server (shell.server) against real HTTP clients, slow and hostile ones
included: paths only on their own port, probes that say why, a silent or trickling client dropped after
the idle timeout while the probes keep answering, a stuck metrics collection that holds no probe, and a
busy port or foreign address refused at start with one line naming it."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time

import pytest
from prometheus_client import CollectorRegistry, Counter

from nodefabric_devicemanager.shell.errors import StartupError
from nodefabric_devicemanager.shell.flags import Listen
from nodefabric_devicemanager.shell.server import (
    PortUnavailable,
    Probe,
    ProbeServer,
    alive,
    exposition,
    readiness,
    runner,
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _get(port: int, path: str, method: str = "GET", host: str = "127.0.0.1") -> tuple[int, str]:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body.decode()


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("nodefabric_test_things", "Things counted.", registry=registry).inc()
    return registry


@pytest.fixture
async def served():
    port = free_port()
    server = ProbeServer(
        Listen("127.0.0.1", port, port),
        metrics=exposition(_registry()),
        live=alive,
        ready=lambda: Probe(False, "no pass has completed yet"),
        idle_timeout=0.5,
    )
    async with server:
        yield port


async def test_probes_and_metrics_share_a_port_and_say_why(served):
    assert await _get(served, "/healthz") == (200, "ok\n")
    assert await _get(served, "/readyz") == (503, "no pass has completed yet\n")
    status, text = await _get(served, "/metrics")
    assert status == 200 and "nodefabric_test_things_total 1.0" in text
    assert (await _get(served, "/nope"))[0] == 404
    assert (await _get(served, "/healthz", method="POST"))[0] == 405
    assert (await _get(served, "/healthz", method="HEAD"))[0] == 200


async def test_each_path_only_on_its_own_port():
    mport, hport = free_port(), free_port()
    async with ProbeServer(
        Listen("127.0.0.1", mport, hport),
        metrics=exposition(_registry()),
        live=alive,
        ready=readiness(lambda: (True, "registered")),
    ):
        assert [(await _get(mport, p))[0] for p in ("/metrics", "/healthz", "/readyz")] == [200, 404, 404]
        assert [(await _get(hport, p))[0] for p in ("/metrics", "/healthz", "/readyz")] == [404, 200, 200]
        assert await _get(hport, "/readyz") == (200, "registered\n")


async def test_a_port_of_none_is_off_and_a_probe_not_given_is_not_served():
    hport = free_port()
    async with ProbeServer(Listen("127.0.0.1", None, hport), metrics=exposition(), live=alive) as server:
        assert (await _get(hport, "/healthz"))[0] == 200
        assert (await _get(hport, "/readyz"))[0] == 404, "no readiness given: no /readyz"
        assert (await _get(hport, "/metrics"))[0] == 404
        assert len(server._runners) == 1


async def test_a_json_probe_keeps_its_content_type_and_body():
    port = free_port()
    probe = Probe(True, '{"nodes": 3}', "application/json")
    async with ProbeServer(Listen("127.0.0.1", None, port), metrics=None, live=lambda: probe):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        raw = (await asyncio.wait_for(reader.read(), 10)).decode()
        writer.close()
    assert "Content-Type: application/json" in raw and raw.endswith('\r\n\r\n{"nodes": 3}')


async def test_a_stuck_metrics_collection_answers_503_and_blocks_no_probe():
    port = free_port()
    release = threading.Event()
    calls = []

    def stuck(_: str) -> tuple[bytes, str]:
        calls.append(1)
        release.wait(10)
        return b"late\n", "text/plain"

    try:
        async with ProbeServer(
            Listen("127.0.0.1", port, port), metrics=stuck, live=alive, metrics_budget=0.3
        ):
            scrapes = [asyncio.ensure_future(_get(port, "/metrics")) for _ in range(5)]
            assert await _get(port, "/healthz") == (200, "ok\n"), "answered while the metrics are stuck"
            answers = await asyncio.gather(*scrapes)
            assert all(status == 503 for status, _ in answers), answers
            assert len(calls) == 1, "scrapes during a stuck collection share it: one thread held, not five"
            release.set()
            await asyncio.sleep(0.1)
            assert await _get(port, "/metrics") == (200, "late\n")
    finally:
        release.set()


async def test_a_silent_client_is_dropped_and_never_blocks_the_probes(served):
    silent = [await asyncio.open_connection("127.0.0.1", served) for _ in range(50)]
    try:
        assert (await _get(served, "/healthz"))[0] == 200, "answered while 50 connections say nothing"
        closed = await asyncio.wait_for(asyncio.gather(*(r.read() for r, _ in silent)), 10)
        assert closed == [b""] * 50, "every silent connection was closed by the server"
    finally:
        for _, w in silent:
            w.close()


async def _held(port: int, pause: float, request: bytes) -> float:
    """Seconds the server keeps a connection that sends `request` one byte every `pause` seconds."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    try:
        for byte in request:
            writer.write(bytes([byte]))
            try:
                await writer.drain()
                got = await asyncio.wait_for(reader.read(1), pause)
            except TimeoutError:
                continue  # still open: send the next byte
            except ConnectionError:
                break
            assert got == b"", "the server answered half a request"
            break
        return time.monotonic() - started
    finally:
        writer.close()


async def test_a_client_trickling_its_headers_is_dropped_after_the_idle_timeout(served):
    # 41 bytes at 0.2 s each: 8 s if every byte re-armed the timer; the idle timeout is 0.5 s.
    held = await _held(served, 0.2, b"GET /healthz HTTP/1.1\r\nHost: operator\r\n\r\n")
    assert held < 3, f"held for {held:.1f} s"
    assert (await _get(served, "/healthz"))[0] == 200


async def test_a_client_between_requests_is_dropped_too(served):
    reader, writer = await asyncio.open_connection("127.0.0.1", served)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: op\r\n\r\n")
    first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert first.startswith(b"HTTP/1.1 200")
    started = time.monotonic()
    rest = await asyncio.wait_for(reader.read(), 10)  # the body, then EOF when the server closes
    assert time.monotonic() - started < 5 and b"ok" in rest
    writer.close()


async def test_the_listeners_bind_only_the_address_asked_for():
    port = free_port()
    async with ProbeServer(Listen("127.0.0.1", port, None), metrics=exposition(), live=alive):
        assert (await _get(port, "/metrics"))[0] == 200
        # 127.0.0.2 is this host too (the whole 127/8 is loopback on Linux), but not the bound address.
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.2", port)


async def test_a_busy_port_is_a_start_up_error_naming_it_and_nothing_stays_bound():
    free = free_port()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        taken = busy.getsockname()[1]
        server = ProbeServer(Listen("127.0.0.1", free, taken), metrics=exposition(), live=alive)
        with pytest.raises(
            PortUnavailable, match=rf"cannot serve health on 127\.0\.0\.1 port {taken}: .*in use"
        ):
            await server.start()
        assert isinstance(PortUnavailable("x"), StartupError)
    # The metrics port bound before the failure was let go.
    with socket.socket() as again:
        again.bind(("127.0.0.1", free))


async def test_an_address_that_is_not_this_hosts_is_one_line_naming_it():
    unknown = ProbeServer(Listen("no-such-host.invalid", free_port(), None), metrics=exposition(), live=alive)
    with pytest.raises(PortUnavailable, match=r"cannot serve metrics on no-such-host\.invalid port \d+: "):
        await unknown.start()
    foreign = ProbeServer(Listen("192.0.2.1", None, free_port()), metrics=None, live=alive)  # TEST-NET
    with pytest.raises(PortUnavailable, match=r"cannot serve health on 192\.0\.2\.1 port \d+: .*address"):
        await foreign.start()


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_an_idle_timeout_that_is_no_duration_is_refused(bad: float):
    with pytest.raises(ValueError, match="idle_timeout must be positive"):
        ProbeServer(Listen("127.0.0.1", 1, 1), metrics=None, live=alive, idle_timeout=bad)
    from aiohttp import web

    with pytest.raises(ValueError, match="idle_timeout must be positive"):
        runner(web.Application(), idle_timeout=bad)


async def test_a_reason_with_a_character_utf8_cannot_carry_is_served_escaped_not_a_500():
    # sysfs names decode with surrogateescape: a reason naming one must not turn the probe into a 500.
    port = free_port()
    reason = "waiting for mlx5_\udcff and é"
    async with ProbeServer(
        Listen("127.0.0.1", port, port), metrics=None, live=alive, ready=lambda: Probe(False, reason)
    ):
        status, body = await _get(port, "/readyz")
    assert status == 503
    assert body == "waiting for mlx5_\\udcff and é\n"


async def test_a_check_or_collector_that_raises_answers_503_saying_why():
    def broken_check() -> Probe:
        raise RuntimeError("the device list is gone\nsecond line")

    def broken_metrics(_: str) -> tuple[bytes, str]:
        raise OSError("cannot read /proc/self/stat")

    port = free_port()
    async with ProbeServer(
        Listen("127.0.0.1", port, port), metrics=broken_metrics, live=alive, ready=broken_check
    ):
        ready = await _get(port, "/readyz")
        metrics = await _get(port, "/metrics")
        live = await _get(port, "/healthz")
    assert ready == (503, "the check failed: the device list is gone\n")
    assert metrics == (503, "the metrics could not be collected: cannot read /proc/self/stat\n")
    assert live == (200, "ok\n")


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: t\r\n\r\n",  # a request line over 8 KiB
        b"GET /healthz HTTP/1.1\r\nHost: t\r\nX: " + b"a" * 100_000 + b"\r\n\r\n",  # a header over 8 KiB
        b"GET /healthz HTTP/1.1\r\n" + b"".join(b"X%d: y\r\n" % i for i in range(5000)) + b"\r\n",
    ],
)
async def test_a_request_too_big_to_parse_is_400_without_a_traceback_in_the_log(
    served, request_bytes: bytes, caplog: pytest.LogCaptureFixture
):
    # A client reaching the probe port must not fill the log: aiohttp logged each as an ERROR with a
    # traceback. Answered 400, told in one debug line, and the probes answer on.
    caplog.set_level(logging.DEBUG)
    reader, writer = await asyncio.open_connection("127.0.0.1", served)
    writer.write(request_bytes)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    assert answer.split(b" ", 2)[1] == b"400"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info], caplog.text
    assert [r for r in caplog.records if r.getMessage() == "bad request refused"]
    assert (await _get(served, "/healthz"))[0] == 200


async def test_a_collection_that_fails_after_the_scrape_gave_up_leaves_no_unretrieved_error(caplog):
    # The scrape answered 503 at its budget; the collection failed later, with nobody awaiting it. Its
    # error was "never retrieved": asyncio logged it with a traceback when the future was collected.
    import gc

    failed = threading.Event()

    def late_failure(_: str) -> tuple[bytes, str]:
        time.sleep(0.3)
        failed.set()
        raise OSError("cannot read /proc/self/stat")

    port = free_port()
    caplog.set_level(logging.ERROR, logger="asyncio")
    async with ProbeServer(
        Listen("127.0.0.1", port, port), metrics=late_failure, live=alive, metrics_budget=0.1
    ):
        assert (await _get(port, "/metrics"))[0] == 503
        assert await asyncio.to_thread(failed.wait, 5)
        await asyncio.sleep(0.1)
        # The next scrape starts a new collection, dropping the failed one.
        assert (await _get(port, "/metrics"))[0] == 503
    gc.collect()
    await asyncio.sleep(0)
    assert "never retrieved" not in caplog.text, caplog.text
