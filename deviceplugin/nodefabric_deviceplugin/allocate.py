"""The allocation response: what a container gets for the tokens kubelet granted it.

Per granted endpoint its own verbs device (one by one, never the whole /dev/infiniband directory, which
would hand every container every adapter), `rdma_cm` once where the host has it, and `NCCL_IB_HCA`
naming exactly the granted devices. Nothing about the allocation is written anywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_deviceplugin.resources import FamilyView, RdmaEndpoint, natural_key
from nodefabric_deviceplugin.verbs import RDMA_CM, VerbsIndex, has_rdma_cm

NCCL_IB_HCA = "NCCL_IB_HCA"
PERMISSIONS = "rw"


class UnknownToken(Exception):
    """A granted token that parses to no endpoint of the family: refused, never silently dropped."""

    def __init__(self, family: str, tokens: Sequence[str]) -> None:
        super().__init__(f"unknown {family} device id(s) {', '.join(tokens)}: no such endpoint in the record")
        self.tokens = list(tokens)


@dataclass(frozen=True, slots=True)
class DeviceNode:
    path: str  # the same path on the host and in the container


@dataclass(frozen=True, slots=True)
class ContainerGrant:
    endpoints: tuple[RdmaEndpoint, ...]
    devices: tuple[DeviceNode, ...]
    envs: dict[str, str]


def endpoints_for(view: FamilyView, ids: Sequence[str]) -> list[RdmaEndpoint]:
    """The distinct endpoints behind the granted ids (several shared tokens may name one endpoint)."""
    unknown = [i for i in ids if i not in view.by_id]
    if unknown:
        raise UnknownToken(view.family.value, unknown)
    seen: dict[str, RdmaEndpoint] = {}
    for i in ids:
        ep = view.by_id[i].endpoint
        seen.setdefault(ep.key, ep)
    return sorted(seen.values(), key=lambda e: natural_key(e.rdma_device))


def nccl_ib_hca(endpoints: Sequence[RdmaEndpoint]) -> str:
    # "=" makes NCCL match whole names: "mlx5_1" alone would also select mlx5_10..mlx5_19.
    return "=" + ",".join(e.rdma_device for e in endpoints)


def grant(host: HostRoot, view: FamilyView, ids: Sequence[str]) -> ContainerGrant:
    """Resolve one container's granted ids. Raises UnknownToken or verbs.VerbsUnresolvable."""
    endpoints = endpoints_for(view, ids)
    if not endpoints:
        return ContainerGrant((), (), {})
    verbs = VerbsIndex(host)
    devices = [DeviceNode(verbs.resolve(ep.rdma_device)) for ep in endpoints]
    if has_rdma_cm(host):
        devices.append(DeviceNode(RDMA_CM))
    return ContainerGrant(tuple(endpoints), tuple(devices), {NCCL_IB_HCA: nccl_ib_hca(endpoints)})
