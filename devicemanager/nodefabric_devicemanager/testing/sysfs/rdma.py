"""RDMA devices: a function's (or a platform device's, or a software one's) `infiniband/<dev>` with its
ports, `/sys/class/infiniband/<dev>`, uverbs character devices in either layout, and rdma_cm."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nodefabric_devicemanager.testing.sysfs.pci import PciTree

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
class RdmaTree(PciTree):
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
