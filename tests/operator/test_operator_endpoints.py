"""The operator's HTTP listeners against slow and hostile clients: a client that connects and says
nothing, or trickles its request headers, is disconnected after the idle timeout while the probes keep
answering; the listeners bind only the address asked for; a bad address or flag is one line at start."""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import time

import pytest

from nodefabric_operator import cli
from nodefabric_operator.endpoints import Endpoints, PortUnavailable
from nodefabric_operator.metrics import Metrics


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _get(host: str, port: int, path: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: op\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return int(raw.split(b" ", 2)[1]), raw


@pytest.fixture
async def served():
    port = free_port()
    ep = Endpoints(Metrics(), lambda: {"nodes": 0}, metrics_port=port, health_port=port, idle_timeout=0.5)
    ep.host = "127.0.0.1"
    await ep.start()
    try:
        yield port
    finally:
        await ep.stop()


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
    assert (await _get("127.0.0.1", served, "/healthz"))[0] == 200


async def test_many_silent_clients_are_all_dropped_and_the_probe_answers_meanwhile(served):
    silent = [await asyncio.open_connection("127.0.0.1", served) for _ in range(50)]
    try:
        assert (await _get("127.0.0.1", served, "/healthz"))[0] == 200
        closed = await asyncio.wait_for(asyncio.gather(*(r.read() for r, _ in silent)), 10)
        assert closed == [b""] * 50, "every silent connection was closed by the server"
    finally:
        for _, w in silent:
            w.close()


async def test_a_client_between_requests_is_dropped_too(served):
    reader, writer = await asyncio.open_connection("127.0.0.1", served)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: op\r\n\r\n")
    first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert first.startswith(b"HTTP/1.1 200")
    started = time.monotonic()
    rest = await asyncio.wait_for(reader.read(), 10)  # the body, then EOF when the server closes
    assert time.monotonic() - started < 5 and b"nodes" in rest
    writer.close()


async def test_the_listeners_bind_only_the_address_asked_for():
    port = free_port()
    ep = Endpoints(Metrics(), dict, metrics_port=port, host="127.0.0.1")
    await ep.start()
    try:
        assert (await _get("127.0.0.1", port, "/metrics"))[0] == 200
        # 127.0.0.2 is this host too (the whole 127/8 is loopback on Linux), but not the bound address.
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.2", port)
    finally:
        await ep.stop()


async def test_an_address_that_is_not_this_hosts_is_one_line_naming_it():
    ep = Endpoints(Metrics(), dict, metrics_port=free_port(), host="no-such-host.invalid")
    with pytest.raises(PortUnavailable, match=r"cannot serve metrics on no-such-host\.invalid port \d+: "):
        await ep.start()
    ep2 = Endpoints(Metrics(), dict, health_port=free_port(), host="192.0.2.1")  # TEST-NET: not ours
    with pytest.raises(PortUnavailable, match=r"cannot serve health on 192\.0\.2\.1 port \d+: .*address"):
        await ep2.start()


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "1e9", "x", ""])
def test_a_bad_idle_timeout_is_refused_by_the_parser(bad, capsys):
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["--idle-timeout", bad])
    assert exc.value.code == 2 and "--idle-timeout" in capsys.readouterr().err


def test_the_flags_reach_the_options():
    opts = cli.options(_parse("--bind-address", "127.0.0.1", "--idle-timeout", "2.5"))
    assert (opts.bind_address, opts.idle_timeout) == ("127.0.0.1", 2.5)
    defaults = cli.options(_parse())
    assert (defaults.bind_address, defaults.idle_timeout) == ("0.0.0.0", 10.0)


def test_an_empty_address_is_refused_at_start(caplog):
    with caplog.at_level(logging.ERROR):
        assert cli.run(_parse("--bind-address", " ")) == 2
    assert "--bind-address is empty" in caplog.records[-1].error
