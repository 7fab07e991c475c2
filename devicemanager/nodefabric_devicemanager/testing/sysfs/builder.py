"""The whole builder: every layer, and the composites a test reaches for (a ConnectX NIC, SR-IOV)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nodefabric_devicemanager.testing.sysfs.net import NetTree
from nodefabric_devicemanager.testing.sysfs.pci import CONNECTX7, CONNECTX7_VF, ETHERNET_CLASS, MELLANOX
from nodefabric_devicemanager.testing.sysfs.rdma import Port, RdmaTree


@dataclass
class SysfsBuilder(NetTree, RdmaTree):
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
