"""A disabled target's objects where the operator may not touch that target's kinds (RBAC of one's own,
or a chart from before it granted their removal): the writer's clean-up at start was refused (403) and
said as a WARNING, as if something had failed. It is nothing we may clean: one INFO line per target,
no WARNING, no retry, and the enabled targets are written as ever. The API server refusing is played
by a proxy in front of the embedded API that answers 403 to every request on the disabled kinds."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from test_topology_operator import FLEET, KAI_T, KUEUE_T, api
from test_topology_removal import MANAGED, _all, _topology

from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_operator.demo.kubeapi import RunningAPI, write_kubeconfig
from nodefabric_operator.metrics import Metrics
from nodefabric_operator.topology import project
from nodefabric_operator.topology.levels import default_levels
from nodefabric_operator.topology.nesting import check
from nodefabric_operator.topology.writer import Writer

__all__ = ["api"]

REFUSED = ("/apis/kueue.x-k8s.io/", "/apis/topology.volcano.sh/v1alpha1/hypernodes")
SAID = "no right to remove a disabled target's objects: any it wrote stay"


async def refusing(k: RunningAPI, tmp_path) -> AsyncIterator[str]:
    """A proxy to `k` refusing (403) the disabled targets' objects; its kubeconfig. Discovery passes."""

    async def forward(request: web.Request) -> web.StreamResponse:
        path = request.rel_url.path
        if path.startswith(REFUSED) and path.rstrip("/").count("/") > 3:
            body = {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "reason": "Forbidden",
                "code": 403,
            }
            return web.json_response(body, status=403)
        kept = {h: request.headers[h] for h in ("Accept", "Authorization") if h in request.headers}
        body = await request.read()
        if body:  # as sent; aiohttp would label a body sent without one application/octet-stream
            kept["Content-Type"] = request.headers.get("Content-Type", "application/json")
        async with (
            aiohttp.ClientSession() as s,
            s.request(request.method, k.url + str(request.rel_url), data=body or None, headers=kept) as r,
        ):
            return web.Response(status=r.status, body=await r.read(), content_type=r.content_type)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield write_kubeconfig(f"http://127.0.0.1:{port}", str(tmp_path))
    finally:
        await runner.cleanup()


@pytest.fixture
async def proxied(api: RunningAPI, tmp_path) -> AsyncIterator[str]:
    async for kubeconfig in refusing(api, tmp_path):
        yield kubeconfig


async def test_a_disabled_target_the_operator_may_not_touch_is_one_info_line(
    api: RunningAPI, proxied: str, caplog: pytest.LogCaptureFixture
) -> None:
    k = api
    caplog.set_level(logging.INFO, logger="nodefabric_operator")
    # Written while Kueue was on (straight into the API): ours, and left where we may not touch it.
    k.api.put_object(KUEUE_T, _topology("kueue.x-k8s.io/v1beta2", "nodefabric", labels=MANAGED))
    writer = Writer(
        load_client(proxied),
        Metrics(),
        targets=("kai",),
        name="nodefabric",
        owner=None,
        discovery_ttl=3600,
        event=lambda notice: None,
    )
    await asyncio.to_thread(writer.discover)
    await asyncio.to_thread(writer.clean_disabled)
    await asyncio.to_thread(writer.write_target, project.KAI, check(default_levels(), FLEET), FLEET)
    ours = [r for r in caplog.records if r.name.startswith("nodefabric_operator")]
    assert [(r.getMessage(), getattr(r, "error", "")) for r in ours if r.levelno >= logging.WARNING] == []
    assert sorted(r.target for r in ours if r.getMessage() == SAID) == [project.KUEUE, project.VOLCANO]
    assert "nodefabric" in _all(k, KUEUE_T)  # left as it was
    assert "nodefabric" in _all(k, KAI_T)  # the enabled target written as ever
