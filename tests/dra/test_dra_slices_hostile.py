"""ResourceSlices edited by someone else into shapes the API server accepts: the driver's pool must come
back to what the host says, never stay wedged. Real HTTP to the embedded API, which refuses what a real
API server refuses (integers beyond int64)."""

from __future__ import annotations

import asyncio
from typing import Any

from dra_helpers import DRIVER, NODE, SLICES, HgxDriver, live_slices

from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_operator.demo.kubeapi import RunningAPI

INT64_MAX = 2**63 - 1


async def wait_until(predicate: Any, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.05)


async def test_a_pool_generation_edited_to_the_int64_limit_does_not_wedge_the_pool(
    api: RunningAPI, hgx_driver: HgxDriver, hgx_spec: DevicesSpec
) -> None:
    """The next generation would be 2**63, which no API server stores: every write of the pool would be
    refused forever. The pool starts again from generation 1 instead, with the host's devices."""
    name = f"{NODE}-{DRIVER}-0"
    edited = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": INT64_MAX, "resourceSliceCount": 1},
            "devices": [],
        },
    }
    api.api.put_object(SLICES, edited)
    async with hgx_driver(hgx_spec) as r:
        await wait_until(lambda: r.driver.publisher.syncs >= 1)
        (obj,) = live_slices(api)
        assert obj["spec"]["pool"]["generation"] <= INT64_MAX
        assert len(obj["spec"]["devices"]) == 11
