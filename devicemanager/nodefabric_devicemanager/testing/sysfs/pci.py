"""PCI functions as the kernel lays them out: `/sys/devices/<host bridge>/<parent chain>/<bdf>/`, their
identity files and `/sys/bus/pci/devices/<bdf>`; bridges and switches."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from nodefabric_devicemanager.testing.sysfs.tree import Tree

MELLANOX = "15b3"
CONNECTX7 = "1021"
CONNECTX7_VF = "101e"
NVIDIA = "10de"
ETHERNET_CLASS = "020000"
INFINIBAND_CLASS = "020700"
BRIDGE_CLASS = "060400"


@dataclass
class PciTree(Tree):
    functions: dict[str, Path] = field(default_factory=dict)  # bus id -> function directory

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
