"""The allocation response: what a container gets for the endpoints it was granted.

Per granted endpoint its own verbs device (one by one, never the whole /dev/infiniband directory, which
would hand every container every adapter), `rdma_cm` once where the host has it, and `NCCL_IB_HCA`
naming exactly the granted devices. Nothing about the allocation is written anywhere.

`grant` is the one place this is decided: the device plugin's Allocate and the DRA driver's prepare both
call it, so the same endpoint gives a container the same thing either way. It is pure; the host's verbs
devices come in as a `verbs.VerbsDevices` (read with `verbs.read_devices`, or cached by `VerbsCache`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from nodefabric_deviceplugin.resources import FamilyView, RdmaEndpoint, natural_key
from nodefabric_deviceplugin.verbs import RDMA_CM, VerbsDevices, VerbsUnresolvable

NCCL_IB_HCA = "NCCL_IB_HCA"
PERMISSIONS = "rw"
# How many ids an error message or a log line quotes: kubelet may send thousands, and a gRPC status
# message over 8 KiB reaches kubelet as RESOURCE_EXHAUSTED instead of the error it describes.
SHOWN_IDS = 5


def first_few(items: Sequence[str], shown: int = SHOWN_IDS) -> str:
    """`a, b, c` or `a, b, c, ... (10000 in all)`, each item cut to 80 characters."""
    head = ", ".join(repr(i[:80]) if len(i) > 80 or not i.isprintable() else i for i in items[:shown])
    return head if len(items) <= shown else f"{head}, ... ({len(items)} in all)"


class UnknownToken(Exception):
    """A granted token that parses to no endpoint of the family: refused, never silently dropped."""

    def __init__(self, family: str, tokens: Sequence[str]) -> None:
        super().__init__(f"unknown {family} device id(s) {first_few(tokens)}: no such endpoint in the record")
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
    return sorted(seen.values(), key=lambda ep: _name_order(ep.rdma_device))


# The order NCCL_IB_HCA lists granted devices in. Kept for the names granted lately, not for every
# endpoint of the record: on a node with 1,024 VFs those keys were a third of the device plugin's memory.
@functools.lru_cache(maxsize=256)
def _name_order(rdma_device: str) -> tuple[tuple[int, int | str], ...]:
    return natural_key(rdma_device)


def nccl_ib_hca(endpoints: Sequence[RdmaEndpoint]) -> str:
    # "=" makes NCCL match whole names: "mlx5_1" alone would also select mlx5_10..mlx5_19.
    return "=" + ",".join(e.rdma_device for e in endpoints)


def grant(endpoints: Sequence[RdmaEndpoint], verbs: VerbsDevices) -> ContainerGrant:
    """What one container gets for `endpoints` (distinct, in the order NCCL_IB_HCA will list them).

    Raises verbs.VerbsUnresolvable, naming every location checked, for the first endpoint without a
    verbs device: a container that cannot open its adapter must fail at admission, not at job start.
    """
    if not endpoints:
        return ContainerGrant((), (), {})
    devices: list[DeviceNode] = []
    for ep in endpoints:
        node = verbs.nodes.get(ep.rdma_device)
        if node is None:
            raise verbs.unresolved.get(ep.rdma_device) or VerbsUnresolvable(
                ep.rdma_device, ["(the verbs devices were not read for it)"]
            )
        devices.append(DeviceNode(node))
    if verbs.rdma_cm:
        devices.append(DeviceNode(RDMA_CM))
    return ContainerGrant(tuple(endpoints), tuple(devices), {NCCL_IB_HCA: nccl_ib_hca(endpoints)})
