"""Builders of Devices records for the operator's tests: realistic shapes, only the fields that matter."""

from __future__ import annotations

from typing import Any

from nodefabric_devicemanager import models
from nodefabric_devicemanager.models import (
    Accelerator,
    AcceleratorGroup,
    AcceleratorTopology,
    Devices,
    DevicesSpec,
    Fabric,
    FabricKind,
    Interface,
    LinkState,
    LinkVerdict,
    ObjectMeta,
    VirtualFunction,
)

SWITCH = ["0000:18:08.0", "0000:17:00.0", "0000:16:01.0"]  # innermost first


def nic(
    name: str = "ens1f0",
    *,
    bus_id: str = "0000:19:00.0",
    rdma: bool = True,
    link: LinkState | None = LinkState.OK,
    numa: str = "0",
    switches: list[str] | None = None,
    vfs: list[VirtualFunction] | None = None,
) -> Interface:
    return Interface(
        name=name,
        bus="pci",
        pci_bus_id=bus_id,
        pci_switches=list(SWITCH if switches is None else switches),
        pci_host_bridge="pci0000:16",
        numa_affinity=numa,
        up=True,
        rdma=rdma,
        rdma_device=f"mlx5_{name[-1]}" if rdma else "",
        link=LinkVerdict(state=link) if link is not None else None,
        virtual_functions=vfs or [],
    )


def vf(bus_id: str, *, rdma: bool = True, link: LinkState | None = None, numa: str = "0") -> VirtualFunction:
    return VirtualFunction(
        pci_bus_id=bus_id,
        pci_switches=list(SWITCH),
        pci_host_bridge="pci0000:16",
        numa_affinity=numa,
        rdma=rdma,
        rdma_device="mlx5_9" if rdma else "",
        link=LinkVerdict(state=link) if link is not None else None,
    )


def gpu(
    index: int,
    *,
    fabric: Fabric | None = None,
    bus_id: str | None = None,
    switches: list[str] | None = None,
    numa: str = "0",
) -> Accelerator:
    return Accelerator(
        id=f"GPU-{index}",
        index=index,
        topology=AcceleratorTopology(
            pci_bus_id=bus_id if bus_id is not None else f"0000:1a:0{index}.0",
            pci_switches=list(SWITCH if switches is None else switches),
            pci_host_bridge="pci0000:16",
            numa_affinity=numa,
            fabric=fabric,
        ),
    )


def nvlink(
    cluster: str = "5b0e112233445566778899aabbccddef", clique: int | None = 1, members: int = 18
) -> Fabric:
    return Fabric(kind=FabricKind.NVLINK, id=cluster, clique_id=clique, member_count=members)


def ub(pod: str = "7", members: int = 48) -> Fabric:
    return Fabric(kind=FabricKind.UB, id=pod, member_count=members)


def group(manufacturer: str, *accelerators: Accelerator) -> AcceleratorGroup:
    return AcceleratorGroup(id=manufacturer, manufacturer=manufacturer, accelerators=list(accelerators))


def devices(
    name: str = "n1",
    *,
    interfaces: list[Interface] | None = None,
    groups: list[AcceleratorGroup] | None = None,
    conditions: dict[str, bool | str] | None = None,
) -> Devices:
    record = Devices(
        metadata=ObjectMeta(name=name),
        spec=DevicesSpec(interfaces=interfaces or [], groups=groups or []),
    )
    for type_, ok in (conditions or {}).items():
        record.status.conditions.append(
            models.Condition(
                type=type_, status=ok if isinstance(ok, str) else "True" if ok else "False", reason="Test"
            )
        )
    return record


def wire(record: Devices) -> dict[str, Any]:
    return record.wire()


def gpu_record(name: str, link: LinkState = LinkState.OK) -> Devices:
    """A node's record of one NIC (its link `link`) beside one NVLink GPU: what the operator labels
    rdma-capable."""
    return devices(name, interfaces=[nic(link=link)], groups=[group("nvidia", gpu(0, fabric=nvlink()))])
