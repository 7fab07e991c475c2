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
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from nodefabric_devicemanager.hostroot import HostRoot

STATE_CODES = {"NOP": 0, "DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5}
PHYS_STATE_CODES = {
    "Sleep": 1,
    "Polling": 2,
    "Disabled": 3,
    "PortConfigurationTraining": 4,
    "LinkUp": 5,
    "LinkErrorRecovery": 6,
    "Phy Test": 7,
}

MELLANOX = "15b3"
CONNECTX7 = "1021"
CONNECTX7_VF = "101e"
NVIDIA = "10de"
ETHERNET_CLASS = "020000"
INFINIBAND_CLASS = "020700"
BRIDGE_CLASS = "060400"


@dataclass(frozen=True)
class Port:
    state: str = "ACTIVE"
    phys_state: str = "LinkUp"
    link_layer: str = "Ethernet"
    rate: str = "400 Gb/sec (4X NDR)"
    # Write these bytes verbatim instead of the "N: NAME" form (odd kernels, garbage, tests).
    raw_state: str | None = None
    raw_phys_state: str | None = None
    unreadable: bool = False  # state is a directory: opening works, reading fails, whatever the uid
    # Netdevs of the port's GID entries 0, 1, ... (`gid_attrs/ndevs/<i>`); None leaves an entry out.
    gid_netdevs: tuple[str | None, ...] = ()


def port_value(name: str, codes: dict[str, int]) -> str:
    return f"{codes.get(name, 0)}: {name}"


@dataclass
class SysfsBuilder:
    root: Path
    functions: dict[str, Path] = field(default_factory=dict)  # bus id -> function directory
    _netdevs: int = 0

    @property
    def host(self) -> HostRoot:
        return HostRoot.at(self.root)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        for d in ("sys/bus/pci/devices", "sys/class/net", "sys/devices/virtual/net", "dev"):
            self.mkdir("/" + d)

    # -- generic ---------------------------------------------------------------------------------------

    def path(self, host_path: str) -> Path:
        return self.root / host_path.lstrip("/")

    def mkdir(self, host_path: str) -> Path:
        p = self.path(host_path)
        p.mkdir(parents=True, exist_ok=True)
        return p

    def write(self, host_path: str | Path, content: str | bytes) -> Path:
        p = host_path if isinstance(host_path, Path) else self.path(host_path)
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content if content.endswith("\n") else content + "\n")
        return p

    def link(self, host_path: str | Path, target: str | Path) -> Path:
        """A relative symlink at `host_path` pointing at `target` (host-absolute str or a real Path)."""
        p = host_path if isinstance(host_path, Path) else self.path(host_path)
        t = target if isinstance(target, Path) else self.path(target)
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_symlink():
            p.unlink()
        p.symlink_to(os.path.relpath(t, p.parent))
        return p

    def attrs(self, directory: Path, values: dict[str, str | bytes]) -> None:
        for name, value in values.items():
            self.write(directory / name, value)

    def _replace(self, host_path: str | Path) -> Path:
        p = host_path if isinstance(host_path, Path) else self.path(host_path)
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_symlink() or p.is_file():
            p.unlink()
        return p

    def fifo(self, host_path: str | Path) -> Path:
        """A named pipe where a file should be (replacing it): a blocking open of it never returns."""
        p = self._replace(host_path)
        os.mkfifo(p)
        return p

    def chardev(self, host_path: str | Path) -> Path:
        """A character device node (1:3, what /dev/null is) where a file should be. Needs CAP_MKNOD."""
        p = self._replace(host_path)
        os.mknod(p, stat.S_IFCHR | 0o600, os.makedev(1, 3))
        return p

    # -- PCI -------------------------------------------------------------------------------------------

    def function(
        self,
        bus_id: str,
        *,
        parent: str | None = None,
        host_bridge: str | None = None,
        vendor: str = MELLANOX,
        device: str = CONNECTX7,
        class_code: str = ETHERNET_CLASS,
        numa: int | None = None,
        cpus: str | None = None,
        attrs: dict[str, str | bytes] | None = None,
    ) -> Path:
        """Any PCI function. Without `parent` it hangs from `host_bridge` (default pci<domain>:<bus>)."""
        if parent is not None:
            base = self.functions[parent]
        else:
            domain, bus = bus_id.split(":")[:2]
            base = self.mkdir(f"/sys/devices/{host_bridge or f'pci{domain}:{bus}'}")
        d = base / bus_id
        d.mkdir(parents=True, exist_ok=True)
        self.attrs(
            d,
            {
                "vendor": f"0x{vendor}",
                "device": f"0x{device}",
                "class": f"0x{class_code}",
                "numa_node": str(-1 if numa is None else numa),
            },
        )
        if cpus is not None:
            self.write(d / "local_cpulist", cpus)
        self.link(d / "subsystem", "/sys/bus/pci")
        if attrs:
            self.attrs(d, attrs)
        self.link(f"/sys/bus/pci/devices/{bus_id}", d)
        self.functions[bus_id] = d
        return d

    def bridge(self, bus_id: str, *, parent: str | None = None, host_bridge: str | None = None) -> Path:
        return self.function(
            bus_id,
            parent=parent,
            host_bridge=host_bridge,
            vendor="8086",
            device="352a",
            class_code=BRIDGE_CLASS,
        )

    def switch(self, upstream: str, downstream: list[str], *, parent: str) -> None:
        """A PCIe switch: its upstream port below `parent`, downstream ports below the upstream one."""
        self.function(upstream, parent=parent, vendor="1000", device="c030", class_code=BRIDGE_CLASS)
        for port in downstream:
            self.function(port, parent=upstream, vendor="1000", device="c030", class_code=BRIDGE_CLASS)

    # -- network interfaces ----------------------------------------------------------------------------

    def _netdev_attrs(self, d: Path, name: str, mtu: int, operstate: str, flags: str) -> None:
        self._netdevs += 1
        index = self._netdevs
        self.attrs(
            d,
            {
                "mtu": str(mtu),
                "operstate": operstate,
                "flags": flags,
                "address": f"02:00:00:00:{index // 256:02x}:{index % 256:02x}",
                "type": "1",
                "ifindex": str(index),
            },
        )
        self.link(f"/sys/class/net/{name}", d)

    def netdev(
        self, bus_id: str, name: str, *, mtu: int = 1500, operstate: str = "up", flags: str = "0x1003"
    ) -> Path:
        fn = self.functions[bus_id]
        d = fn / "net" / name
        d.mkdir(parents=True, exist_ok=True)
        self.link(d / "device", fn)
        self._netdev_attrs(d, name, mtu, operstate, flags)
        return d

    def virtual(
        self,
        name: str,
        *,
        kind: str = "",
        mtu: int = 1500,
        operstate: str = "up",
        flags: str = "0x1003",
        lower: list[str] | None = None,
    ) -> Path:
        """A software interface (lo, bond, vlan, bridge, veth) under /sys/devices/virtual/net."""
        d = self.mkdir(f"/sys/devices/virtual/net/{name}")
        self._netdev_attrs(d, name, mtu, operstate, flags)
        if kind == "bond":
            self.write(d / "bonding" / "slaves", " ".join(lower or []))
        elif kind == "bridge":
            self.mkdir(f"/sys/devices/virtual/net/{name}/bridge")
        for low in lower or []:
            self.link(d / f"lower_{low}", f"/sys/class/net/{low}")
        return d

    def platform(self, name: str, platform_device: str, *, mtu: int = 1500, operstate: str = "up") -> Path:
        """A netdev on a platform device (SoC NIC): no PCI function anywhere above it."""
        pdev = self.mkdir(f"/sys/devices/platform/{platform_device}")
        self.link(pdev / "subsystem", "/sys/bus/platform")
        self.mkdir("/sys/bus/platform")
        d = pdev / "net" / name
        d.mkdir(parents=True, exist_ok=True)
        self.link(d / "device", pdev)
        self._netdev_attrs(d, name, mtu, operstate, "0x1003")
        return d

    def virtio(self, name: str, transport: str, *, index: int = 0, mtu: int = 1500) -> Path:
        """virtio-net as in a VM: the netdev hangs from virtio<index>, whose parent is a PCI function."""
        if transport not in self.functions:
            self.function(transport, vendor="1af4", device="1041", class_code=ETHERNET_CLASS)
        vdev = self.functions[transport] / f"virtio{index}"
        vdev.mkdir(parents=True, exist_ok=True)
        self.attrs(vdev, {"vendor": "0x1af4", "device": "0x0001"})
        self.link(vdev / "subsystem", "/sys/bus/virtio")
        self.mkdir("/sys/bus/virtio")
        d = vdev / "net" / name
        d.mkdir(parents=True, exist_ok=True)
        self.link(d / "device", vdev)
        self._netdev_attrs(d, name, mtu, "up", "0x1003")
        return d

    # -- RDMA ------------------------------------------------------------------------------------------

    def rdma_device(
        self,
        bus_id: str,
        dev: str,
        *,
        ports: list[Port] | None = None,
        verbs: int | None = None,
        verbs_layout: str = "both",
    ) -> Path:
        d = self._ib_device(self.functions[bus_id], dev, ports)
        if verbs is not None:
            self.verbs(bus_id, dev, verbs, layout=verbs_layout)
        return d

    def _ib_device(self, parent: Path | None, dev: str, ports: list[Port] | None) -> Path:
        """`<parent>/infiniband/<dev>` (a device-less one under /sys/devices/virtual/infiniband), its
        ports, and `/sys/class/infiniband/<dev>`."""
        if parent is None:
            d = self.mkdir(f"/sys/devices/virtual/infiniband/{dev}")
        else:
            d = parent / "infiniband" / dev
            d.mkdir(parents=True, exist_ok=True)
            self.link(d / "device", parent)
        self.write(d / "node_type", "1: CA")
        for n, port in enumerate(ports if ports is not None else [Port()], start=1):
            pd = d / "ports" / str(n)
            pd.mkdir(parents=True, exist_ok=True)
            if port.unreadable:
                (pd / "state").mkdir(exist_ok=True)
            else:
                self.write(pd / "state", port.raw_state or port_value(port.state, STATE_CODES))
            self.write(
                pd / "phys_state", port.raw_phys_state or port_value(port.phys_state, PHYS_STATE_CODES)
            )
            self.write(pd / "link_layer", port.link_layer)
            self.write(pd / "rate", port.rate)
            for index, netdev in enumerate(port.gid_netdevs):
                if netdev is not None:
                    self.write(pd / "gid_attrs" / "ndevs" / str(index), netdev)
        self.link(f"/sys/class/infiniband/{dev}", d)
        return d

    def platform_rdma(
        self, platform_device: str, dev: str, *, ports: list[Port] | None = None, verbs: int | None = None
    ) -> Path:
        """An RDMA device hanging from a platform device (`/sys/devices/platform/<platform_device>`)."""
        pdev = self.mkdir(f"/sys/devices/platform/{platform_device}")
        self.link(pdev / "subsystem", "/sys/bus/platform")
        self.mkdir("/sys/bus/platform")
        d = self._ib_device(pdev, dev, ports)
        if verbs is not None:
            self._verbs_at(pdev, dev, verbs)
        return d

    def soft_rdma(
        self,
        dev: str,
        netdev: str | None,
        *,
        ports: list[Port] | None = None,
        verbs: int | None = None,
    ) -> Path:
        """A software RDMA device (rxe, siw): no parent device; `parent` names the netdev it rides on
        (None: no `parent` attribute, so only the ports' GID netdevs say it)."""
        d = self._ib_device(None, dev, ports)
        if netdev is not None:
            self.write(d / "parent", netdev)
        if verbs is not None:
            self._verbs_at(self.mkdir("/sys/devices/virtual"), dev, verbs)
        return d

    def _verbs_at(self, parent: Path, dev: str, n: int) -> None:
        name = f"uverbs{n}"
        vd = parent / "infiniband_verbs" / name
        self.attrs(vd, {"ibdev": dev, "abi_version": "1", "dev": f"231:{192 + n}"})
        self.link(f"/sys/class/infiniband_verbs/{name}", vd)
        self.write(f"/dev/infiniband/{name}", "")

    def verbs(self, bus_id: str, dev: str, n: int, *, layout: str = "both") -> None:
        fn = self.functions[bus_id]
        name = f"uverbs{n}"
        if layout in ("both", "device"):
            vd = fn / "infiniband_verbs" / name
            self.attrs(vd, {"ibdev": dev, "abi_version": "1", "dev": f"231:{192 + n}"})
            self.link(vd / "device", fn)
            if layout == "both":
                self.link(f"/sys/class/infiniband_verbs/{name}", vd)
        if layout == "class":
            vd = self.mkdir(f"/sys/class/infiniband_verbs/{name}")
            self.attrs(vd, {"ibdev": dev, "abi_version": "1", "dev": f"231:{192 + n}"})
            self.link(vd / "device", fn)
        self.write(f"/dev/infiniband/{name}", "")

    def rdma_cm(self) -> None:
        self.write("/dev/infiniband/rdma_cm", "")

    def unreadable_rdma(self, bus_id: str) -> None:
        """`<fn>/infiniband` exists but cannot be listed (a file where a directory belongs; fails as root)."""
        self.write(self.functions[bus_id] / "infiniband", "")

    # -- composites ------------------------------------------------------------------------------------

    def nic(
        self,
        bus_id: str,
        name: str | None,
        *,
        parent: str | None = None,
        host_bridge: str | None = None,
        numa: int | None = None,
        cpus: str | None = None,
        rdma: str | None = None,
        ports: list[Port] | None = None,
        verbs: int | None = None,
        mtu: int = 9000,
        operstate: str = "up",
        device: str = CONNECTX7,
        attrs: dict[str, str | bytes] | None = None,
    ) -> Path:
        """A ConnectX function with an optional netdev (`name=None`: none) and optional RDMA device."""
        fn = self.function(
            bus_id,
            parent=parent,
            host_bridge=host_bridge,
            vendor=MELLANOX,
            device=device,
            class_code=ETHERNET_CLASS,
            numa=numa,
            cpus=cpus,
            attrs=attrs,
        )
        self.mkdir("/sys/bus/pci/drivers/mlx5_core")
        self.link(fn / "driver", "/sys/bus/pci/drivers/mlx5_core")
        if name is not None:
            self.netdev(bus_id, name, mtu=mtu, operstate=operstate)
        if rdma is not None:
            self.rdma_device(bus_id, rdma, ports=ports, verbs=verbs)
        return fn

    def sriov(
        self,
        pf: str,
        *,
        vfs: int,
        total: int | None = None,
        numa: int | None = None,
        netdev_prefix: str | None = None,
        rdma_prefix: str | None = None,
        first_rdma: int = 0,
        first_verbs: int | None = None,
        ports: list[Port] | None = None,
    ) -> list[str]:
        """`vfs` virtual functions as siblings of `pf` at consecutive functions (0000:19:00.1, ...)."""
        pf_dir = self.functions[pf]
        parent_dir = pf_dir.parent
        self.attrs(
            pf_dir,
            {"sriov_totalvfs": str(total if total is not None else max(vfs, 8)), "sriov_numvfs": str(vfs)},
        )
        domain, bus, devfn = pf.split(":")
        dev, fn = devfn.split(".")
        base = int(dev, 16) * 8 + int(fn)
        out: list[str] = []
        for i in range(vfs):
            n = base + 1 + i
            vf = f"{domain}:{bus}:{n // 8:02x}.{n % 8}"
            d = parent_dir / vf
            d.mkdir(parents=True, exist_ok=True)
            self.functions[vf] = d
            self.attrs(
                d,
                {
                    "vendor": f"0x{MELLANOX}",
                    "device": f"0x{CONNECTX7_VF}",
                    "class": f"0x{ETHERNET_CLASS}",
                    "numa_node": str(-1 if numa is None else numa),
                },
            )
            self.link(d / "subsystem", "/sys/bus/pci")
            self.link(d / "physfn", pf_dir)
            self.link(pf_dir / f"virtfn{i}", d)
            self.link(f"/sys/bus/pci/devices/{vf}", d)
            if netdev_prefix is not None:
                self.netdev(vf, f"{netdev_prefix}{i}")
            if rdma_prefix is not None:
                verbs = None if first_verbs is None else first_verbs + i
                self.rdma_device(vf, f"{rdma_prefix}{first_rdma + i}", ports=ports, verbs=verbs)
            out.append(vf)
        return out
