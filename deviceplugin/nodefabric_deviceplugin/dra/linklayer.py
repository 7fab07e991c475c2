"""The link layer of each RDMA device (InfiniBand or Ethernet/RoCE), read from the host.

The Devices record does not carry it, so the driver reads `/sys/class/infiniband/<dev>/ports/*/link_layer`
itself, through the same capped, root-checked reader as the inventory. A device whose ports disagree, or
that could not be read, gets no link layer (the attribute is then absent, never guessed).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from nodefabric_devicemanager.hostroot import HostReadError, HostRoot

log = logging.getLogger(__name__)

RDMA_CLASS = "/sys/class/infiniband"
KNOWN = ("InfiniBand", "Ethernet")


def link_layer(host: HostRoot, rdma_device: str) -> str | None:
    """The one link layer all of the device's ports report; None when unknown, unreadable or mixed."""
    try:
        ports = host.dir(RDMA_CLASS).child(rdma_device).child("ports")
        seen = {ports.child(p).read_opt("link_layer") for p in ports.list()}
    except (FileNotFoundError, ValueError):  # ValueError: not a single path component
        return None
    except HostReadError as exc:
        log.warning("cannot read a link layer", extra={"rdma_device": rdma_device, "why": exc.reason})
        return None
    found = {s.strip() for s in seen if s is not None}
    if len(found) != 1:
        return None
    layer = found.pop()
    return layer if layer in KNOWN else None


def link_layers(host: HostRoot, rdma_devices: Iterable[str]) -> dict[str, str]:
    """rdma device -> link layer, for the devices whose link layer is known."""
    out: dict[str, str] = {}
    for dev in rdma_devices:
        layer = link_layer(host, dev)
        if layer is not None:
            out[dev] = layer
    return out
