"""Build realistic sysfs trees for tests and the demo: real directories and RELATIVE symlinks, laid out
the way the kernel lays them out, so the code under test resolves them exactly as on a node.

    from nodefabric_devicemanager.testing.sysfs import Port, SysfsBuilder

    b = SysfsBuilder(tmp_path)                          # tmp_path becomes the host root ("/")
    b.bridge("0000:16:01.0", host_bridge="pci0000:16")  # root port directly on host bridge pci0000:16
    b.bridge("0000:17:00.0", parent="0000:16:01.0")     # switch upstream port
    b.bridge("0000:18:08.0", parent="0000:17:00.0")     # switch downstream port
    b.bridge("0000:18:10.0", parent="0000:17:00.0")     # (or: b.switch(up, [downs...], parent=rp))
    b.nic("0000:19:00.0", "ens1f0", parent="0000:18:08.0", numa=0, rdma="mlx5_0", verbs=0)
    b.function("0000:1a:00.0", parent="0000:18:10.0", vendor="10de", device="2330", class_code="030200",
               numa=0, attrs={"current_link_speed": "32.0 GT/s PCIe"})   # any PCI function (a GPU)
    b.sriov("0000:19:00.0", vfs=12, rdma_prefix="mlx5_", first_rdma=2)   # VFs 0000:19:00.1 .. 0000:19:01.4
    b.virtual("bond0", kind="bond")                     # /sys/devices/virtual/net/bond0
    b.platform("eth9", "ff0c0000.ethernet")             # a non-PCI interface (bus "platform")
    b.virtio("eth0", "0000:00:03.0", index=2)           # virtio-net: netdev under virtio2 under a PCI fn
    host = b.host                                       # HostRoot.at(b.root): what the code reads

What each call lays out:
- `function`/`bridge`: `/sys/devices/<host bridge>/<parent chain>/<bdf>/` with vendor, device, class
  (0x-prefixed, as the kernel prints them), numa_node (-1 when `numa=None`), local_cpulist (when given),
  a `subsystem` link to /sys/bus/pci, any extra `attrs` files, and `/sys/bus/pci/devices/<bdf>` ->
  `../../../devices/...`. `parent=` names an earlier bridge; without it the function hangs directly
  from `host_bridge`.
- `netdev`: `<function dir>/net/<name>/` (mtu, operstate, flags, address, type, `device` -> `../../`),
  plus `/sys/class/net/<name>` -> it.
- `rdma_device`: `<function dir>/infiniband/<dev>/ports/<n>/{state,phys_state,link_layer,rate}` and
  `/sys/class/infiniband/<dev>` -> it; `verbs=N` adds uverbsN in BOTH layouts (`/sys/class/
  infiniband_verbs/uverbsN` -> `<function dir>/infiniband_verbs/uverbsN` holding `ibdev`) unless
  `verbs_layout` picks one ("class": only the class directory as a real directory; "device": only under
  the function), and `/dev/infiniband/uverbsN` as a plain file. `rdma_cm()` adds `/dev/infiniband/rdma_cm`.
- `nic`: `function` + `netdev` + (optionally) `rdma_device`, with a Mellanox ConnectX-7 identity.
- `sriov`: `sriov_totalvfs`/`sriov_numvfs` on the PF, VFs as sibling functions with `physfn` ->
  `../<pf>`, and `virtfnN` -> `../<vf>` on the PF; VF netdevs and RDMA devices optional.
- `platform_rdma(platform_device, dev)`: an RDMA device hanging from a platform device (a SoC NIC's
  RDMA engine), `soft_rdma(dev, netdev)`: a software one (rxe, siw) under /sys/devices/virtual/infiniband
  naming the netdev it rides on in `parent`. Either can carry per-port GID netdevs
  (`Port(gid_netdevs=("eth0",))` writes `ports/N/gid_attrs/ndevs/0`).
- `write(path, content)` / `link(path, target)` / `mkdir(path)`: anything else, host-absolute paths;
  `link` takes the target as a host-absolute path and stores it relative.
- Hostile entries: `fifo(path)` (a named pipe: opening it for reading blocks until a writer comes),
  `chardev(path)` (a character device node, /dev/null's numbers; needs root).
Ports are `Port(state="ACTIVE", phys_state="LinkUp")`; the kernel's "N: NAME" form is written for you.

The builder is cut by what it lays out, one class each, combined in `SysfsBuilder`: `tree.Tree` (files,
links, hostile entries), `pci.PciTree` (functions, bridges, switches), `net.NetTree` (network
interfaces), `rdma.RdmaTree` (RDMA devices, verbs) and `builder.SysfsBuilder` (a NIC, SR-IOV).
"""

from __future__ import annotations

from nodefabric_devicemanager.testing.sysfs.builder import SysfsBuilder
from nodefabric_devicemanager.testing.sysfs.pci import (
    BRIDGE_CLASS,
    CONNECTX7,
    CONNECTX7_VF,
    ETHERNET_CLASS,
    INFINIBAND_CLASS,
    MELLANOX,
    NVIDIA,
)
from nodefabric_devicemanager.testing.sysfs.rdma import PHYS_STATE_CODES, STATE_CODES, Port, port_value

__all__ = [
    "BRIDGE_CLASS",
    "CONNECTX7",
    "CONNECTX7_VF",
    "ETHERNET_CLASS",
    "INFINIBAND_CLASS",
    "MELLANOX",
    "NVIDIA",
    "PHYS_STATE_CODES",
    "STATE_CODES",
    "Port",
    "SysfsBuilder",
    "port_value",
]
