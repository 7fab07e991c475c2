"""AMD XGMI hives from sysfs: the KFD topology and amdgpu's `xgmi_hive_info`, read through HostRoot.

KFD lists CPU and GPU nodes alike; only nodes with a non-zero `gpu_id` are GPUs, so a hive's members are
counted among those (an APU's CPU node can carry the hive id too). `hive_id` 0 means no hive.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

from nodefabric_devicemanager.hostroot import HostRoot, SysDir

log = logging.getLogger(__name__)

KFD_NODES = "/sys/class/kfd/kfd/topology/nodes"
IOLINK_TYPE_XGMI = 11


@dataclass
class KfdGpu:
    node: int
    bus_id: str
    hive_id: int
    xgmi_peers: dict[int, int] = field(default_factory=dict)  # peer KFD node -> XGMI links


def _properties(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1], 0)
            except ValueError:
                continue
    return out


def location_bus_id(domain: int, location_id: int) -> str:
    """KFD's (domain, location_id = bus << 8 | devfn) as a sysfs PCI address."""
    bus, devfn = location_id >> 8, location_id & 0xFF
    return f"{domain:04x}:{bus:02x}:{devfn >> 3:02x}.{devfn & 7}"


def read_kfd(host: HostRoot) -> list[KfdGpu] | None:
    """The GPU nodes of the KFD topology; None when the topology is absent (amdgpu not loaded).

    Raises HostReadError when it exists but cannot be read, FileNotFoundError when a GPU node lacks its
    properties (or vanished while being read).
    """
    if not host.exists(KFD_NODES):
        return None
    nodes = host.dir(KFD_NODES)
    gpus: list[KfdGpu] = []
    for name in nodes.list():
        if not name.isdigit():
            continue
        node = nodes.child(name)
        gpu_id = (node.read_opt("gpu_id") or "0").strip()
        if gpu_id in ("", "0"):
            continue
        props = _properties(node.read("properties"))
        gpu = KfdGpu(
            node=int(name),
            bus_id=location_bus_id(props.get("domain", 0), props.get("location_id", 0)),
            hive_id=props.get("hive_id", 0),
        )
        gpu.xgmi_peers = _xgmi_peers(node)
        gpus.append(gpu)
    return gpus


def _xgmi_peers(node: SysDir) -> dict[int, int]:
    links = node.child_opt("io_links")
    if links is None:
        return {}
    peers: Counter[int] = Counter()
    for name in links.list():
        props = _properties(links.child(name).read_opt("properties") or "")
        if props.get("type") == IOLINK_TYPE_XGMI and "node_to" in props:
            peers[props["node_to"]] += 1
    return dict(peers)


def xgmi_hive_from_pci(fn_dir: SysDir) -> int | None:
    """amdgpu's per-device answer (the same directory as /sys/class/drm/cardN/device); None when absent."""
    info = fn_dir.child_opt("xgmi_hive_info")
    if info is None:
        return None
    raw = info.read_opt("xgmi_hive_id")
    if raw is None:
        return None
    try:
        return int(raw.strip(), 0)
    except ValueError:
        log.warning("ignored an unparsable xgmi hive id", extra={"path": info.shown, "value": raw.strip()})
        return None
