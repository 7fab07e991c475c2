"""Network interfaces: a PCI function's netdevs, software ones under /sys/devices/virtual/net, a
platform device's, and virtio-net's; each with `/sys/class/net/<name>`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nodefabric_devicemanager.testing.sysfs.pci import ETHERNET_CLASS, PciTree


@dataclass
class NetTree(PciTree):
    _netdevs: int = 0

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
