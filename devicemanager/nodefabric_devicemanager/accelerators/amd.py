"""AMD XGMI hives from sysfs: the KFD topology and amdgpu's `xgmi_hive_info`, read through HostRoot.

KFD lists CPU and GPU nodes alike; only nodes with a non-zero `gpu_id` are GPUs, so a hive's members are
counted among those (an APU's CPU node can carry the hive id too). `hive_id` 0 means no hive.

Every number goes through numbers.py (the kernel prints them with %u/%llu). A value that is not one is
a failed read of the fabric (`BadNumber`, a ValueError), never "no hive": reading garbage as 0 would
take a GPU out of its hive and the node's fabric labels with it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from nodefabric_devicemanager import numbers
from nodefabric_devicemanager.hostroot import HostRoot, SysDir

KFD_NODES = "/sys/class/kfd/kfd/topology/nodes"
IOLINK_TYPE_XGMI = 11


@dataclass
class KfdGpu:
    node: int
    bus_id: str
    hive_id: int
    xgmi_peers: dict[int, int] = field(default_factory=dict)  # peer KFD node -> XGMI links


# The properties this reader uses; others (some signed, some driver-specific) are never parsed.
_USED = frozenset({"domain", "location_id", "hive_id", "type", "node_to"})


def _properties(text: str) -> dict[str, int]:
    """`name value` lines. A used property whose value is not a plain decimal raises BadNumber."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in _USED:
            value = numbers.parse(parts[1], numbers.KFD_PROPERTY)
            assert value is not None  # KFD_PROPERTY has no "unknown" spelling
            out[parts[0]] = value
    return out


def location_bus_id(domain: int, location_id: int) -> str:
    """KFD's (domain, location_id = bus << 8 | devfn) as a sysfs PCI address."""
    bus, devfn = (location_id >> 8) & 0xFF, location_id & 0xFF
    return f"{domain & 0xFFFFFFFF:04x}:{bus:02x}:{devfn >> 3:02x}.{devfn & 7}"


def read_kfd(host: HostRoot) -> list[KfdGpu] | None:
    """The GPU nodes of the KFD topology; None when the topology is absent (amdgpu not loaded).

    Raises HostReadError when it exists but cannot be read, FileNotFoundError when a GPU node lacks its
    properties (or vanished while being read), BadNumber when a number in it is not one.
    """
    if not host.present(KFD_NODES):
        return None
    nodes = host.dir(KFD_NODES)
    gpus: list[KfdGpu] = []
    for name in nodes.list():
        index = numbers.parse_opt(name, numbers.KFD_NODE)
        if index is None:
            continue  # not a node directory
        node = nodes.child(name)
        if not numbers.parse(node.read("gpu_id"), numbers.KFD_PROPERTY):
            continue  # gpu_id 0: a CPU node
        props = _properties(node.read("properties"))
        gpu = KfdGpu(
            node=index,
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
    # amdgpu prints it "%llu"; anything else is a failed read (BadNumber), not "no hive".
    return numbers.parse(raw, numbers.XGMI_HIVE_ID)
