"""The one /metrics, /healthz and /readyz server of every long-running command, and the connection
limits of every aiohttp listener the product runs.

Served from the command's own event loop, so a loop that stops turning stops answering /healthz (what a
liveness probe is for); the probes answer from memory. /metrics is collected in a thread within a budget:
the process collector reads /proc, and nothing that reads files runs on the loop. The sockets are bound
at start: a busy port, or an address that is not this host's, is a StartupError naming it.

aiohttp arms a connection's keep-alive timer when the connection opens and re-arms it only after a
response, never as bytes arrive: a client that connects and says nothing, or trickles its request headers
a byte at a time, is closed when the timer fires, wherever it is in its headers. aiohttp's default is an
hour, so each such client held a socket that long; `idle_timeout` is that timer. A request body the
handler did not read is drained for at most LINGER_S before the close.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable

import prometheus_client
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CollectorRegistry

from nodefabric_devicemanager.shell.errors import StartupError, first_line
from nodefabric_devicemanager.shell.flags import Listen
from nodefabric_devicemanager.shell.probe import Probe, ProbeFn, alive, readiness

log = logging.getLogger(__name__)

# kubelet opens a connection per probe and Prometheus one per scrape target, each sending its request at
# once: 10 s is far beyond any of them and bounds what a silent or trickling client holds.
IDLE_TIMEOUT_S = 10.0
# After refusing (or not reading) a body, aiohttp would read and discard the rest of it for 10 s.
LINGER_S = 1.0
# /metrics that cannot be collected within this long answers 503 rather than holding the scrape.
METRICS_BUDGET_S = 5.0


# The Accept header -> the body and its Content-Type (which may carry a charset).
Exposition = Callable[[str], tuple[bytes, str]]


def exposition(*registries: CollectorRegistry) -> Exposition:
    """The Prometheus text format of `registries` (the process-wide one when none is given)."""
    chosen = registries or (prometheus_client.REGISTRY,)

    def collect(_: str) -> tuple[bytes, str]:
        return b"".join(
            prometheus_client.generate_latest(r) for r in chosen
        ), prometheus_client.CONTENT_TYPE_LATEST

    return collect


def no_created_series() -> None:
    """Drop the `_created` series prometheus_client adds to every counter: one more time series per
    label set that no dashboard reads. Process-wide, so it is called once, by the command."""
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]


class _ClientErrors(logging.Filter):
    """aiohttp logs a request it cannot parse (a request line or header over 8 KiB, too many headers, not
    HTTP at all) as an ERROR with a traceback: any client reaching a port could fill the log with them.
    The client's mistake is answered 400 and told here in one debug line; a handler's own error (a 500)
    keeps its ERROR and traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError) and 400 <= (exc.code or 0) < 500:
            log.debug("bad request refused", extra={"status": exc.code, "error": first_line(exc.message)})
            return False
        return True


_REQUESTS = logging.getLogger(f"{__name__}.requests")
_REQUESTS.addFilter(_ClientErrors())


def runner(app: web.Application, *, idle_timeout: float = IDLE_TIMEOUT_S) -> web.AppRunner:
    """The runner of one aiohttp listener: no access log (the components log what matters), no signal
    handling (the command owns its signals), and the connection limits above."""
    if not idle_timeout > 0:
        raise ValueError(f"idle_timeout must be positive, got {idle_timeout!r}")
    return web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        keepalive_timeout=idle_timeout,
        lingering_time=LINGER_S,
        # No listener takes a compressed request body (the extender and the webhook refuse one 415 before
        # reading it), yet aiohttp inflated whatever it read, the rest of a refused body too while it
        # lingered: a gzip bomb was a second of the event loop, a body that was not gzip an ERROR and
        # three tracebacks. Read as sent, a body is only its own bytes.
        auto_decompress=False,
        logger=_REQUESTS,
    )


def _probe_handler(probe: ProbeFn) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def answer(_: web.Request) -> web.Response:
        try:
            got = probe()
        except Exception as err:  # a check that cannot say is a probe that fails, with why; not a 500
            log.warning("probe failed", extra={"error": first_line(err)})
            got = Probe(False, f"the check failed: {first_line(err)}")
        text = got.reason
        if got.content_type == "text/plain" and not text.endswith("\n"):
            text += "\n"  # a reason is one line, for `curl` and `kubectl describe pod` alike
        # A reason may carry a name read from the host (sysfs names decode with surrogateescape): an
        # unencodable character is written escaped rather than failing the probe with a 500.
        body = text.encode("utf-8", "backslashreplace")
        response = web.Response(body=body, status=200 if got.ok else 503)
        response.headers["Content-Type"] = got.content_type  # may carry a charset, which aiohttp refuses
        return response

    return answer


def _metrics_handler(metrics: Exposition, budget: float) -> Callable[[web.Request], Awaitable[web.Response]]:
    running: asyncio.Future[tuple[bytes, str]] | None = None

    async def answer(request: web.Request) -> web.Response:
        nonlocal running
        # One collection at a time: scrapes that come while one runs share it, so a /proc read stuck in
        # the kernel holds one thread, never one per scrape.
        if running is None or running.done():
            running = asyncio.ensure_future(asyncio.to_thread(metrics, request.headers.get("Accept", "")))
            # A collection that fails after every scrape waiting on it gave up: its error is read here, so
            # asyncio does not log it as "never retrieved" with a traceback; the next scrape collects anew.
            running.add_done_callback(lambda done: done.cancelled() or done.exception())
        try:
            body, content_type = await asyncio.wait_for(asyncio.shield(running), budget)
        except TimeoutError:
            return web.Response(status=503, text=f"the metrics took longer than {budget:g} s\n")
        except Exception as err:  # a collector that raises: the scrape fails with why, not a traceback
            log.warning("metrics collection failed", extra={"error": first_line(err)})
            return web.Response(status=503, text=f"the metrics could not be collected: {first_line(err)}\n")
        response = web.Response(body=body)
        response.headers["Content-Type"] = content_type
        return response

    return answer


def add_routes(
    app: web.Application,
    *,
    metrics: Exposition | None = None,
    live: ProbeFn | None = None,
    ready: ProbeFn | None = None,
    metrics_budget: float = METRICS_BUDGET_S,
) -> web.Application:
    """Mount /metrics, /healthz and /readyz (each that is given) on `app`."""
    if metrics is not None:
        app.router.add_get("/metrics", _metrics_handler(metrics, metrics_budget))
    if live is not None:
        app.router.add_get("/healthz", _probe_handler(live))
    if ready is not None:
        app.router.add_get("/readyz", _probe_handler(ready))
    return app


def _why(err: OSError) -> str:
    # aiohttp wraps a bind error's text; getaddrinfo's (an address that is no address) have a negative
    # errno of their own, and their text in strerror.
    if isinstance(err, socket.gaierror) or not err.errno:
        return err.strerror or str(err)
    return os.strerror(err.errno)


class PortUnavailable(StartupError):
    """A port that cannot be bound: in use, not ours to bind, or an address that is not this host's."""


class ProbeServer:
    """/metrics on the metrics port, /healthz and /readyz on the health port (one listener when the two
    are equal; a path is served only on its own port); a port of None is off."""

    def __init__(
        self,
        where: Listen,
        *,
        metrics: Exposition | None,
        live: ProbeFn | None,
        ready: ProbeFn | None = None,
        idle_timeout: float = IDLE_TIMEOUT_S,
        metrics_budget: float = METRICS_BUDGET_S,
    ) -> None:
        if not idle_timeout > 0:
            raise ValueError(f"idle_timeout must be positive, got {idle_timeout!r}")
        self.where = where
        self.metrics, self.live, self.ready = metrics, live, ready
        self.idle_timeout = idle_timeout
        self.metrics_budget = metrics_budget
        self._runners: list[web.AppRunner] = []

    def _plan(self) -> dict[int, tuple[bool, bool]]:
        """port -> (serves /metrics, serves the probes)."""
        plan: dict[int, tuple[bool, bool]] = {}
        if self.where.metrics_port is not None and self.metrics is not None:
            plan[self.where.metrics_port] = (True, False)
        if self.where.health_port is not None and (self.live or self.ready) is not None:
            metrics, _ = plan.get(self.where.health_port, (False, False))
            plan[self.where.health_port] = (metrics, True)
        return plan

    async def start(self) -> None:
        """Bind every port. Raises PortUnavailable naming what, where and why."""
        host = self.where.host
        try:
            for port, (metrics, probes) in self._plan().items():
                app = add_routes(
                    web.Application(),
                    metrics=self.metrics if metrics else None,
                    live=self.live if probes else None,
                    ready=self.ready if probes else None,
                    metrics_budget=self.metrics_budget,
                )
                served = runner(app, idle_timeout=self.idle_timeout)
                await served.setup()
                self._runners.append(served)
                what = " and ".join(n for n, on in (("metrics", metrics), ("health", probes)) if on)
                try:
                    await web.TCPSite(served, host, port, reuse_address=True).start()
                except OSError as err:
                    raise PortUnavailable(f"cannot serve {what} on {host} port {port}: {_why(err)}") from err
                paths = (["/metrics"] if metrics else []) + (["/healthz", "/readyz"] if probes else [])
                log.info("serving http", extra={"address": f"{host}:{port}", "paths": paths})
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        while self._runners:
            await self._runners.pop().cleanup()

    async def __aenter__(self) -> ProbeServer:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()


__all__ = [
    "IDLE_TIMEOUT_S",
    "Exposition",
    "PortUnavailable",
    "Probe",
    "ProbeFn",
    "ProbeServer",
    "add_routes",
    "alive",
    "exposition",
    "no_created_series",
    "readiness",
    "runner",
]
