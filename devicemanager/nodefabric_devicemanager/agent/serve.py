"""HTTP endpoints: /metrics (Prometheus text), /healthz (liveness) and /readyz (readiness).

Metrics and probes may share a port or use two; port 0 turns that listener off.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Probe:
    """A probe's answer: ok, and a one-line reason an operator reads from `kubectl describe pod`."""

    ok: bool
    reason: str


def _probe_handler(probe: Callable[[], Probe]) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(_: web.Request) -> web.Response:
        answer = probe()
        return web.Response(status=200 if answer.ok else 503, text=answer.reason + "\n")

    return handle


def build_app(
    *,
    registries: Sequence[CollectorRegistry],
    live: Callable[[], Probe] | None,
    ready: Callable[[], Probe] | None,
) -> web.Application:
    app = web.Application()
    if registries:

        async def metrics(_: web.Request) -> web.Response:
            # The agent's own registry plus the process-wide one (the in-process device plugin's metrics).
            body = b"".join(generate_latest(r) for r in registries)
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

        app.router.add_get("/metrics", metrics)
    if live is not None:
        app.router.add_get("/healthz", _probe_handler(live))
    if ready is not None:
        app.router.add_get("/readyz", _probe_handler(ready))
    return app


class Servers:
    """The agent's listeners, started together and stopped together."""

    def __init__(self) -> None:
        self._runners: list[web.AppRunner] = []

    async def start(
        self,
        *,
        host: str,
        metrics_port: int,
        health_port: int,
        registries: Sequence[CollectorRegistry],
        live: Callable[[], Probe],
        ready: Callable[[], Probe],
    ) -> None:
        if metrics_port and metrics_port == health_port:
            await self._serve(build_app(registries=registries, live=live, ready=ready), host, metrics_port)
            return
        if metrics_port:
            await self._serve(build_app(registries=registries, live=None, ready=None), host, metrics_port)
        if health_port:
            await self._serve(build_app(registries=(), live=live, ready=ready), host, health_port)

    async def _serve(self, app: web.Application, host: str, port: int) -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        self._runners.append(runner)
        await web.TCPSite(runner, host, port).start()
        log.info(
            "serving http",
            extra={"address": f"{host}:{port}", "paths": sorted(r.canonical for r in app.router.resources())},
        )

    async def stop(self) -> None:
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
