"""/healthz, /readyz and /metrics for the cluster-side processes (the extender, the placement process).

/healthz fails (503, one problem per line) while a feed has been broken for too long; /readyz fails until
the caches have synced; /metrics is the process's registry in the Prometheus text format.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def add_probes(
    app: web.Application,
    *,
    health: Callable[[], list[str]],
    ready: Callable[[], str | None],
    registry: Callable[[], CollectorRegistry],
) -> web.Application:
    """Mount the three routes. `ready` returns None when ready, else why not."""

    async def healthz(_: web.Request) -> web.Response:
        problems = health()
        if problems:
            return web.Response(text="\n".join(problems) + "\n", status=503)
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        why = ready()
        return web.Response(text="ok") if why is None else web.Response(text=why, status=503)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry()), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app
