"""/metrics, /healthz and /readyz of the standalone `deviceplugin` command, on the event loop it serves
gRPC from (inside the agent, the agent's own endpoints serve these, with `readiness()` from the manager).

/healthz answering proves the loop is not blocked; /readyz says whether kubelet accepted every resource.
The metrics are collected in a thread with a budget: the process collector reads /proc, and nothing that
reads files runs on the loop.
"""

from __future__ import annotations

from collections.abc import Callable

import prometheus_client
from aiohttp import web

from nodefabric_deviceplugin.offloop import ReadTimeout, SingleFlight

METRICS_BUDGET_S = 5.0

Readiness = Callable[[], tuple[bool, str]]


def no_created_series() -> None:
    """Drop the `_created` series prometheus_client adds to every counter: one more time series per
    label set that no dashboard reads. Process-wide, so it is called once, by the command."""
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]


async def serve(address: str, port: int, readiness: Readiness) -> web.AppRunner:
    """Serve the three endpoints; raises OSError when the port cannot be bound (busy, no permission)."""
    flight: SingleFlight[bytes] = SingleFlight("the metrics", METRICS_BUDGET_S)

    async def metrics(_: web.Request) -> web.Response:
        try:
            body = await flight.run(lambda: prometheus_client.generate_latest(prometheus_client.REGISTRY))
        except ReadTimeout as exc:
            return web.Response(status=503, text=f"{exc}\n")
        return web.Response(body=body, headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        ok, message = readiness()
        return web.Response(status=200 if ok else 503, text=message + "\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, address, port).start()
    except OSError:
        await runner.cleanup()
        raise
    return runner
