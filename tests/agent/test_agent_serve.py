"""The agent's HTTP listeners: probes and metrics answer on their own threads, from memory, and a client
that connects and says nothing is dropped rather than holding a thread forever."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request

import pytest
from agent_fixtures import free_port

from nodefabric_devicemanager.agent.metrics import AgentMetrics
from nodefabric_devicemanager.agent.serve import Probe, Servers


def _get(port: int, path: str, method: str = "GET") -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def served():
    port = free_port()
    servers = Servers(idle_timeout=0.5)
    metrics = AgentMetrics()
    servers.start(
        host="127.0.0.1", metrics_port=port, health_port=port, registries=(metrics.registry,),
        live=lambda: Probe(True, "ok"), ready=lambda: Probe(False, "no pass has completed yet"),
    )  # fmt: skip
    try:
        yield port
    finally:
        servers.stop()


def test_probes_and_metrics_share_a_port_and_say_why(served):
    assert _get(served, "/healthz") == (200, "ok\n")
    assert _get(served, "/readyz") == (503, "no pass has completed yet\n")
    status, text = _get(served, "/metrics")
    assert status == 200 and "nodefabric_agent_passes_total" in text
    assert _get(served, "/nope")[0] == 404
    assert _get(served, "/healthz", method="POST")[0] == 405


def test_a_silent_client_is_dropped_and_never_blocks_the_probes(served):
    silent = [socket.create_connection(("127.0.0.1", served)) for _ in range(20)]
    try:
        assert _get(served, "/healthz")[0] == 200, "answered while 20 connections say nothing"
        deadline = time.monotonic() + 10
        for conn in silent:
            conn.settimeout(max(0.1, deadline - time.monotonic()))
            assert conn.recv(1) == b"", "the server closed the idle connection"
    finally:
        for conn in silent:
            conn.close()


def test_a_busy_port_is_an_error_at_start():
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        with pytest.raises(OSError):
            Servers().start(
                host="127.0.0.1", metrics_port=busy.getsockname()[1], health_port=0, registries=(),
                live=lambda: Probe(True, "ok"), ready=lambda: Probe(True, "ok"),
            )  # fmt: skip
    finally:
        busy.close()


def test_a_client_that_trickles_its_request_is_dropped_too(served):
    """The idle timeout bounds each read; a byte every 0.3 s (under the 0.5 s idle timeout of `served`)
    would hold its thread forever. The whole exchange is bounded at two idle timeouts."""
    conn = socket.create_connection(("127.0.0.1", served))
    conn.settimeout(0.3)
    started = time.monotonic()
    try:
        for byte in b"GET /healthz HTTP/1.1\r\nHost: agent\r\n":  # 36 bytes: about 11 s unbounded
            conn.sendall(bytes([byte]))
            try:
                assert conn.recv(1) == b"", "the server said something to half a request"
                break
            except TimeoutError:
                continue  # still open: send the next byte
        held = time.monotonic() - started
    except (BrokenPipeError, ConnectionResetError):
        held = time.monotonic() - started
    finally:
        conn.close()
    assert held < 30 * 0.3, f"held for {held:.1f} s"
    assert _get(served, "/healthz")[0] == 200
