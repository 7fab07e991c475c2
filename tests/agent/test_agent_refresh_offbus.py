"""The agent on RDMA devices bound by name (a platform engine whose ports ride on different interfaces,
soft RoCE): every pass, walk or refresh, judges each interface over the ports that ride on it, as
`nodefabric inventory` does. Judged over every port, one ACTIVE port made a DOWN interface "ok" in the
record the device plugin, the DRA driver and the operator read."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from agent_fixtures import api_with_node, interface, make_agent, stored, until

from nodefabric_devicemanager import inventory
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.testing.scenarios import split_platform_rdma
from nodefabric_devicemanager.testing.sysfs import PHYS_STATE_CODES, STATE_CODES, port_value

PORTS = "sys/devices/platform/HISI00D1:00/infiniband/hns_0/ports"


def set_hns_port(root: Path, port: int, state: str, phys_state: str) -> None:
    (root / PORTS / str(port) / "state").write_text(port_value(state, STATE_CODES))
    (root / PORTS / str(port) / "phys_state").write_text(port_value(phys_state, PHYS_STATE_CODES))


def links(obj) -> dict[str, str]:
    return {name: interface(obj, name)["link"]["state"] for name in ("eth0", "eth1")}


@contextlib.asynccontextmanager
async def running(agent) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_a_walk_records_each_interface_of_a_split_engine_as_inventory_does(tmp_path):
    split_platform_rdma(tmp_path)
    read = inventory.read(HostRoot.at(tmp_path)).interfaces
    assert read is not None
    assert {i.name: i.link.state.value for i in read if i.link} == {"eth0": "ok", "eth1": "failed"}
    async with api_with_node() as k:
        outcome = await make_agent(k, tmp_path).run_pass()
        assert outcome.ok
        assert links(stored(k)) == {"eth0": "ok", "eth1": "failed"}, "port 1 ACTIVE says nothing of eth1"


async def test_a_refresh_judges_each_interface_over_its_own_ports(tmp_path):
    split_platform_rdma(tmp_path)
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path, interval=0.05, walk_interval=3600)
        async with running(agent):
            await until(lambda: stored(k) is not None and links(stored(k))["eth1"] == "failed", what="a walk")
            set_hns_port(tmp_path, 2, "ACTIVE", "LinkUp")  # eth1's port comes up
            await until(lambda: links(stored(k)) == {"eth0": "ok", "eth1": "ok"}, what="eth1 up")
            set_hns_port(tmp_path, 1, "DOWN", "Disabled")  # eth0's port goes down; eth1's stays up
            await until(lambda: links(stored(k)) == {"eth0": "failed", "eth1": "ok"}, what="eth0 down")
            assert "port 1" in interface(stored(k), "eth0")["link"]["reason"]
            assert "port 2" not in interface(stored(k), "eth0")["link"]["reason"]
            walks = agent.metrics.registry.get_sample_value(
                "nodefabric_agent_passes_total", {"kind": "walk", "result": "ok"}
            )
            assert walks == 1, "found by the refresh, not by another walk"
