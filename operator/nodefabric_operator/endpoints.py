"""The operator's HTTP endpoints: `/metrics` and `/healthz`, each on its port and on no other path.

Served from the operator's own event loop, so a loop that stops turning stops answering `/healthz` (what
a liveness probe is for). The sockets are bound before kopf starts: a busy port (or an address that is
not this host's) is a start-up error with one line, never a traceback from inside the framework. A client
that sends no complete request within `idle_timeout` (silent, or trickling its headers) is disconnected
(httpserve), so slow clients cannot pile up sockets beside the probes.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from nodefabric_operator import httpserve
from nodefabric_operator.metrics import Metrics

# kubelet opens a connection per probe and Prometheus one per scrape target, each sending its request at
# once: 10 s is far beyond any of them and bounds what a silent or trickling client holds.
IDLE_TIMEOUT_S = 10.0


class PortUnavailable(OSError):
    pass


@dataclass
class Endpoints:
    metrics: Metrics
    health: Callable[[], Mapping[str, Any]]
    metrics_port: int | None = None
    health_port: int | None = None
    host: str = "0.0.0.0"
    idle_timeout: float = IDLE_TIMEOUT_S
    _runners: list[web.AppRunner] = field(default_factory=list)

    async def _metrics(self, request: web.Request) -> web.Response:
        body, content_type = self.metrics.exposition(request.headers.get("Accept", ""))
        # aiohttp refuses a charset inside content_type; the encoders' types carry one.
        response = web.Response(body=body)
        response.headers["Content-Type"] = content_type
        return response

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response(dict(self.health()), dumps=lambda o: json.dumps(o, sort_keys=True))

    def _routes(self) -> dict[int, list[web.RouteDef]]:
        routes: dict[int, list[web.RouteDef]] = {}
        if self.metrics_port is not None:
            routes.setdefault(self.metrics_port, []).append(web.get("/metrics", self._metrics))
        if self.health_port is not None:
            routes.setdefault(self.health_port, []).append(web.get("/healthz", self._healthz))
        return routes

    async def start(self) -> None:
        """Bind every port (one app per port, so a path is served only on its own port)."""
        try:
            for port, routes in self._routes().items():
                app = web.Application()
                app.add_routes(routes)
                runner = httpserve.runner(app, idle_timeout=self.idle_timeout)
                await runner.setup()
                self._runners.append(runner)
                try:
                    await web.TCPSite(runner, self.host, port, reuse_address=True).start()
                except OSError as err:
                    what = " and ".join(
                        n
                        for n, p in (("metrics", self.metrics_port), ("health", self.health_port))
                        if p == port
                    )
                    # aiohttp wraps a bind error's text; getaddrinfo's (an address that is no address)
                    # have a negative errno of their own, and their text in strerror.
                    if isinstance(err, socket.gaierror) or not err.errno:
                        why = err.strerror or str(err)
                    else:
                        why = os.strerror(err.errno)
                    raise PortUnavailable(f"cannot serve {what} on {self.host} port {port}: {why}") from err
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        while self._runners:
            await self._runners.pop().cleanup()
