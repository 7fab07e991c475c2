"""Helpers of the device-plugin tests: Devices records built from the models, and a running plugin."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import DevicesSpec, Interface, LinkState, LinkVerdict, VirtualFunction
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder
from nodefabric_deviceplugin.api import deviceplugin_pb2 as pb
from nodefabric_deviceplugin.resources import PluginConfig
from nodefabric_deviceplugin.server import DevicePluginManager
from nodefabric_deviceplugin.source import RecordSource
from nodefabric_deviceplugin.testing.kubelet import KubeletEmulator


def scripted_reader(
    readings: list[list[Interface] | Exception | None], stop: asyncio.Event
) -> Callable[[HostRoot], list[Interface] | None]:
    """A host reader answering `readings` in order (an Exception is raised). Asked once more after the
    last, it sets `stop` and answers the last reading again, so every scripted reading was handled.

    Call it on the loop poll_host runs on: the reader runs in a thread and sets `stop` through the loop.
    """
    loop = asyncio.get_running_loop()
    last: list[list[Interface] | Exception | None] = []

    def reader(host: HostRoot) -> list[Interface] | None:
        if readings:
            last[:] = [readings.pop(0)]
        else:
            loop.call_soon_threadsafe(stop.set)
        item = last[0]
        if isinstance(item, Exception):
            raise item
        return item

    return reader


def nic(
    name: str,
    bus_id: str,
    rdma: str = "",
    *,
    numa: str = "",
    link: LinkState | None = LinkState.OK,
    switches: tuple[str, ...] = (),
    host_bridge: str = "",
    vfs: list[VirtualFunction] | None = None,
    num_vfs: int | None = None,
) -> Interface:
    """A top-level interface as the inventory records it."""
    return Interface(
        name=name,
        bus="pci" if bus_id else "",
        pci_bus_id=bus_id,
        pci_root_id=switches[-1] if switches else "",
        pci_switches=list(switches),
        pci_host_bridge=host_bridge or (f"pci{bus_id[:7]}" if bus_id else ""),
        numa_affinity=numa,
        rdma=bool(rdma),
        rdma_device=rdma,
        sriov=vfs is not None,
        sriov_num_vfs=(len(vfs) if vfs is not None else 0) if num_vfs is None else num_vfs,
        link=LinkVerdict(state=link, reason="test") if link is not None else None,
        virtual_functions=vfs or [],
    )


def vf(
    bus_id: str, rdma: str = "", *, name: str = "", numa: str = "", link: LinkState | None = None
) -> VirtualFunction:
    return VirtualFunction(
        name=name,
        bus="pci",
        pci_bus_id=bus_id,
        numa_affinity=numa,
        rdma=bool(rdma),
        rdma_device=rdma,
        link=LinkVerdict(state=link, reason="test") if link is not None else None,
    )


def two_nics_and_vfs() -> DevicesSpec:
    """mlx5_0, mlx5_1 whole on NUMA 0 and 1; a PF with two VFs (mlx5_4 has no netdev); eth0 without RDMA."""
    return DevicesSpec(
        interfaces=[
            nic("eth0", "0000:03:00.0"),
            nic("ens1f0", "0000:19:00.0", "mlx5_0", numa="0"),
            nic("ens2f0", "0000:5e:00.0", "mlx5_1", numa="1"),
            nic(
                "ens3f0",
                "0000:86:00.0",
                "mlx5_2",
                numa="1",
                vfs=[vf("0000:86:00.1", "mlx5_3", name="ens3f0v0", numa="1"), vf("0000:86:00.2", "mlx5_4")],
            ),
        ]
    )


def thousand_vfs(pfs: int = 8, per_pf: int = 128) -> DevicesSpec:
    """pfs PFs with per_pf VFs each, the first half of the PFs on NUMA node 0, the rest on node 1."""
    out = []
    for p in range(pfs):
        # Each PF behind its own root port; its VFs share that bridge path, as the agent records them.
        root = (f"0000:{p:02x}:01.0",)
        vfs = [
            vf(f"0000:{0x10 + p:02x}:{(i + 1) // 8:02x}.{(i + 1) % 8}", f"mlx5_{100 + p * per_pf + i}")
            for i in range(per_pf)
        ]
        for f in vfs:
            f.pci_switches, f.pci_root_id = list(root), root[0]
        out.append(
            nic(
                f"p{p}",
                f"0000:{0x10 + p:02x}:00.0",
                f"mlx5_{p}",
                numa=str(p * 2 // pfs),
                switches=root,
                vfs=vfs,
            )
        )
    return DevicesSpec(interfaces=out)


@dataclass
class FixtureHost:
    builder: SysfsBuilder
    host: HostRoot


@dataclass
class Running:
    kubelet: KubeletEmulator
    manager: DevicePluginManager
    source: RecordSource
    stop: asyncio.Event
    task: asyncio.Task[None]
    config: PluginConfig

    def resource(self, family: str) -> str:
        return f"device.{self.config.domain}/{family}"


async def start_plugin(
    plugin_dir: str,
    host: HostRoot,
    spec: DevicesSpec | None,
    config: PluginConfig | None = None,
    *,
    kubelet: KubeletEmulator | None = None,
    **options: Any,
) -> Running:
    """A plugin serving `spec` to a (started) test kubelet; `options` go to DevicePluginManager."""
    if kubelet is None:
        kubelet = KubeletEmulator(plugin_dir)
        await kubelet.start()
    source = RecordSource(spec)
    config = config or PluginConfig(shared_count=4)
    options.setdefault("retry_base", 0.02)
    manager = DevicePluginManager(source, host, config=config, plugin_dir=plugin_dir, **options)
    stop = asyncio.Event()
    task = asyncio.create_task(manager.run(stop))
    return Running(kubelet, manager, source, stop, task, config)


async def shutdown(running: Running) -> None:
    running.stop.set()
    await asyncio.wait_for(running.task, timeout=30)
    await running.kubelet.stop()


async def eventually(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait until `predicate()` holds, for conditions nothing signals (log records, readiness)."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


def by_id(devices: Iterable[pb.Device]) -> dict[str, pb.Device]:
    return {d.ID: d for d in devices}


def hint(device: pb.Device) -> list[int] | None:
    """The NUMA nodes a device hints, None when it sends no TopologyInfo."""
    return [n.ID for n in device.topology.nodes] if device.HasField("topology") else None


ALL_RESOURCES = (
    "device.gpustack.ai/rdma",
    "device.gpustack.ai/rdma.shared",
    "device.gpustack.ai/rdma.partitioned",
)


async def wait_all_registered(kubelet: KubeletEmulator, count: int, timeout: float = 10.0) -> None:
    """Until kubelet accepted each of the three resources `count` times in all."""
    for resource in ALL_RESOURCES:
        await kubelet.wait_registered(resource, count=count, timeout=timeout)
