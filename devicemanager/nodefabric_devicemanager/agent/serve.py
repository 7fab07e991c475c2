"""HTTP endpoints: /metrics (Prometheus text), /healthz (liveness) and /readyz (readiness).

Served by prometheus_client's threaded WSGI server (the standard library's wsgiref underneath) on daemon
threads, never on the agent's event loop: a probe answers while a pass runs, and answers from memory
only (no host read). Metrics and probes may share a port or use two; port 0 turns that listener off.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIServer, make_server

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.exposition import ThreadingWSGIServer

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Probe:
    """A probe's answer: ok, and a one-line reason an operator reads from `kubectl describe pod`."""

    ok: bool
    reason: str


StartResponse = Callable[[str, list[tuple[str, str]]], Any]


def build_app(
    *,
    registries: Sequence[CollectorRegistry],
    live: Callable[[], Probe] | None,
    ready: Callable[[], Probe] | None,
) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
    probes = {"/healthz": live, "/readyz": ready}

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Content-Type", "text/plain"), ("Allow", "GET, HEAD")])
            return [b"only GET\n"]
        if path == "/metrics" and registries:
            # The agent's own registry plus the process-wide one (process metrics, the device plugin's).
            body = b"".join(generate_latest(r) for r in registries)
            start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST)])
            return [body]
        probe = probes.get(path)
        if probe is None:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found\n"]
        answer = probe()
        start_response("200 OK" if answer.ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
        return [answer.reason.encode() + b"\n"]

    return app


# A client that connects and sends nothing is dropped after this long: with the agent on the host network
# these ports are reachable from the node's network, and each connection holds a thread.
IDLE_TIMEOUT_S = 5.0
# The idle timeout bounds each read, so a client trickling a byte at a time would never meet it: the whole
# exchange is bounded too, at this many idle timeouts.
EXCHANGE_TIMEOUTS = 2


def _shut(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)  # a read or write blocked on it returns at once


def _serve(app: Callable[..., Iterable[bytes]], host: str, port: int, idle_timeout: float) -> WSGIServer:
    """Bind now (so a busy port is a start-up error), serve on a daemon thread."""
    from prometheus_client.exposition import _SilentHandler

    class _Handler(_SilentHandler):
        timeout = idle_timeout

        def handle(self) -> None:
            deadline = threading.Timer(EXCHANGE_TIMEOUTS * idle_timeout, _shut, (self.connection,))
            deadline.daemon = True
            deadline.start()
            try:
                super().handle()
            finally:
                deadline.cancel()

    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    server_class = type("_Server", (ThreadingWSGIServer,), {"address_family": family})
    handler_class = _Handler
    httpd: WSGIServer = make_server(host, port, app, server_class, handler_class=handler_class)
    threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.5}, name=f"http-{port}", daemon=True
    ).start()
    return httpd


class Servers:
    """The agent's listeners, started together and stopped together."""

    def __init__(self, idle_timeout: float = IDLE_TIMEOUT_S) -> None:
        self.idle_timeout = idle_timeout
        self._servers: list[WSGIServer] = []

    def start(
        self,
        *,
        host: str,
        metrics_port: int,
        health_port: int,
        registries: Sequence[CollectorRegistry],
        live: Callable[[], Probe],
        ready: Callable[[], Probe],
    ) -> None:
        """Raises OSError when a port cannot be bound (in use, bad address): a start-up error."""
        plan: list[tuple[int, Sequence[CollectorRegistry], bool]] = []
        if metrics_port and metrics_port == health_port:
            plan.append((metrics_port, registries, True))
        else:
            if metrics_port:
                plan.append((metrics_port, registries, False))
            if health_port:
                plan.append((health_port, (), True))
        try:
            for port, regs, probes in plan:
                app = build_app(
                    registries=regs, live=live if probes else None, ready=ready if probes else None
                )
                self._servers.append(_serve(app, host, port, self.idle_timeout))
                paths = (["/metrics"] if regs else []) + (["/healthz", "/readyz"] if probes else [])
                log.info("serving http", extra={"address": f"{host}:{port}", "paths": paths})
        except OSError:
            self.stop()
            raise

    def stop(self) -> None:
        for httpd in reversed(self._servers):
            httpd.shutdown()
            httpd.server_close()
        self._servers.clear()
