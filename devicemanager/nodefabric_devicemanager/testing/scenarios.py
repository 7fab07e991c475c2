"""Named host layouts built with SysfsBuilder, shared by the tests, the benchmark and the demo.

Each function lays a scenario out under `root` and returns its builder. `SCENARIOS` maps a short name to
each, e.g. `SCENARIOS["gpu8"](tmp_path)`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from nodefabric_devicemanager.testing.sysfs import NVIDIA, Port, SysfsBuilder

L40S = "26b9"  # a PCIe-only GPU: `nvidia-smi topo -m` then shows PCIe levels between GPUs, not NV#
GPU_CLASS = "030200"
CPUS = {0: "0-55,112-167", 1: "56-111,168-223"}

# gpu8: (host bridge bus, NUMA node) per PCIe switch; each switch carries two GPUs and one NIC.
GPU8_SWITCHES = [(0x15, 0), (0x37, 0), (0x97, 1), (0xB7, 1)]


def _bdf(bus: int, dev: int = 0, fn: int = 0) -> str:
    return f"0000:{bus:02x}:{dev:02x}.{fn}"


def gpu8(root: Path) -> SysfsBuilder:
    """8 GPUs and 4 ConnectX-7 NICs behind 4 PCIe switches on 2 NUMA nodes, plus a storage NIC.

    Per host bridge H: root port H:01.0 -> switch upstream (H+1):00.0 -> downstream ports (H+2):00.0,
    (H+2):01.0, (H+2):02.0 -> GPU (H+3):00.0, GPU (H+4):00.0, NIC (H+5):00.0. The storage NIC (mlx5_4)
    hangs from a second root port 15:02.0 of host bridge pci0000:15: PHB from GPU0/GPU1.
    GPU n is `gpu8_gpus()[n]`; NICn is mlx5_n.
    """
    b = SysfsBuilder(root)
    for i, (h, numa) in enumerate(GPU8_SWITCHES):
        rp, up = _bdf(h, 1), _bdf(h + 1)
        downs = [_bdf(h + 2, d) for d in range(3)]
        b.bridge(rp, host_bridge=f"pci0000:{h:02x}")
        b.switch(up, downs, parent=rp)
        for k in range(2):
            b.function(
                _bdf(h + 3 + k),
                parent=downs[k],
                vendor=NVIDIA,
                device=L40S,
                class_code=GPU_CLASS,
                numa=numa,
                cpus=CPUS[numa],
            )
        b.nic(
            _bdf(h + 5),
            f"ibp{h + 5}s0",
            parent=downs[2],
            numa=numa,
            cpus=CPUS[numa],
            rdma=f"mlx5_{i}",
            verbs=i,
        )
    b.bridge("0000:15:02.0", host_bridge="pci0000:15")
    b.nic("0000:1b:00.0", "ens9np0", parent="0000:15:02.0", numa=0, cpus=CPUS[0], rdma="mlx5_4", verbs=4)
    b.virtual("lo", mtu=65536, operstate="unknown", flags="0x9")
    b.rdma_cm()
    return b


def gpu8_gpus() -> list[str]:
    return [_bdf(h + 3 + k) for h, _ in GPU8_SWITCHES for k in range(2)]


def gpu8_nics() -> list[str]:
    return [_bdf(h + 5) for h, _ in GPU8_SWITCHES] + ["0000:1b:00.0"]


def two_level(root: Path) -> SysfsBuilder:
    """Two levels of PCIe switches under one root port (DGX-style):

    0000:00:01.0 root port -> 01:00.0 switch A up -> 02:00.0, 02:01.0 A down
      02:00.0 -> 03:00.0 switch B up -> 04:00.0 -> GPU0 05:00.0 ; 04:01.0 -> NIC0 06:00.0 (mlx5_0)
      02:01.0 -> 07:00.0 switch C up -> 08:00.0 -> GPU1 09:00.0 ; 08:01.0 -> NIC1 0a:00.0 (mlx5_1)
    """
    b = SysfsBuilder(root)
    b.bridge("0000:00:01.0", host_bridge="pci0000:00")
    b.switch("0000:01:00.0", ["0000:02:00.0", "0000:02:01.0"], parent="0000:00:01.0")
    b.switch("0000:03:00.0", ["0000:04:00.0", "0000:04:01.0"], parent="0000:02:00.0")
    b.switch("0000:07:00.0", ["0000:08:00.0", "0000:08:01.0"], parent="0000:02:01.0")
    for gpu, port in (("0000:05:00.0", "0000:04:00.0"), ("0000:09:00.0", "0000:08:00.0")):
        b.function(gpu, parent=port, vendor=NVIDIA, device=L40S, class_code=GPU_CLASS, numa=0, cpus=CPUS[0])
    b.nic("0000:06:00.0", "ibp6s0", parent="0000:04:01.0", numa=0, rdma="mlx5_0", verbs=0)
    b.nic("0000:0a:00.0", "ibp10s0", parent="0000:08:01.0", numa=0, rdma="mlx5_1", verbs=1)
    return b


def sriov(root: Path, *, vfs: int = 16) -> SysfsBuilder:
    """One ConnectX PF (mlx5_0) with `vfs` VFs, each with a netdev ens2f0v<i> and RDMA device mlx5_<i+2>.

    With 12+ VFs, virtfn10 sorts before virtfn2 and ens2f0v10 before ens2f0v2 as strings; bus order differs.
    """
    b = SysfsBuilder(root)
    b.bridge("0000:3a:00.0", host_bridge="pci0000:3a")
    b.nic("0000:3b:00.0", "ens2f0np0", parent="0000:3a:00.0", numa=0, cpus=CPUS[0], rdma="mlx5_0", verbs=0)
    b.sriov(
        "0000:3b:00.0",
        vfs=vfs,
        total=vfs + 4,
        numa=0,
        netdev_prefix="ens2f0v",
        rdma_prefix="mlx5_",
        first_rdma=2,
        first_verbs=2,
    )
    b.rdma_cm()
    return b


def vf_only_rdma(root: Path) -> SysfsBuilder:
    """A PF with no RDMA device of its own whose VFs carry all of the node's RDMA devices (no VF netdevs)."""
    b = SysfsBuilder(root)
    b.nic("0000:5e:00.0", "ens3f0", host_bridge="pci0000:5d", numa=1, cpus=CPUS[1])
    b.sriov("0000:5e:00.0", vfs=4, numa=1, rdma_prefix="mlx5_", first_rdma=0, first_verbs=0)
    return b


def active_defer(root: Path) -> SysfsBuilder:
    """The only RDMA port is ACTIVE_DEFER (lost its link): failed, never read as ACTIVE."""
    b = SysfsBuilder(root)
    b.nic(
        "0000:17:00.0",
        "ens1np0",
        host_bridge="pci0000:16",
        numa=0,
        rdma="mlx5_0",
        ports=[Port(state="ACTIVE_DEFER", phys_state="LinkUp")],
        verbs=0,
    )
    return b


def down_beside_working(root: Path) -> SysfsBuilder:
    """mlx5_0 DOWN/Disabled beside mlx5_1 ACTIVE/LinkUp."""
    b = SysfsBuilder(root)
    b.nic(
        "0000:17:00.0",
        "ens1np0",
        host_bridge="pci0000:16",
        numa=0,
        rdma="mlx5_0",
        ports=[Port(state="DOWN", phys_state="Disabled")],
        verbs=0,
        operstate="down",
    )
    b.nic("0000:18:00.0", "ens2np0", host_bridge="pci0000:16", numa=0, rdma="mlx5_1", verbs=1)
    return b


def unreadable_rdma(root: Path) -> SysfsBuilder:
    """ens1's RDMA tree cannot be listed; ens2's mlx5_1 has one unreadable port beside a DOWN one."""
    b = SysfsBuilder(root)
    b.nic("0000:17:00.0", "ens1np0", host_bridge="pci0000:16", numa=0)
    b.unreadable_rdma("0000:17:00.0")
    b.nic(
        "0000:18:00.0",
        "ens2np0",
        host_bridge="pci0000:16",
        numa=0,
        rdma="mlx5_1",
        ports=[Port(state="DOWN", phys_state="Disabled"), Port(unreadable=True)],
        verbs=1,
    )
    return b


def escaping_symlink(root: Path) -> SysfsBuilder:
    """/sys/class/net/evil points outside the host root (root/../outside)."""
    b = SysfsBuilder(root)
    b.nic("0000:17:00.0", "ens1np0", host_bridge="pci0000:16", numa=0, rdma="mlx5_0")
    outside = Path(root).parent / "outside" / "net" / "evil"
    outside.mkdir(parents=True, exist_ok=True)
    b.write(outside / "mtu", "1500")
    b.link("/sys/class/net/evil", outside)
    return b


def big_attribute(root: Path) -> SysfsBuilder:
    """A NIC whose local_cpulist is 70 KiB: refused whole, never truncated."""
    b = SysfsBuilder(root)
    b.nic("0000:17:00.0", "ens1np0", host_bridge="pci0000:16", numa=0, rdma="mlx5_0")
    b.write(b.functions["0000:17:00.0"] / "local_cpulist", "0," * (35 * 1024))
    return b


def non_pci(root: Path) -> SysfsBuilder:
    """A VM's virtio-net eth0 (virtio2 under PCI function 00:03.0) and a SoC platform NIC."""
    b = SysfsBuilder(root)
    b.virtio("eth0", "0000:00:03.0", index=2, mtu=1400)
    b.platform("end0", "fe1c0000.ethernet")
    b.virtual("lo", mtu=65536, operstate="unknown", flags="0x9")
    return b


def virtual_interfaces(root: Path) -> SysfsBuilder:
    """bond0 over two NICs, a VLAN on it, a bridge, a veth, lo, and `bonding_masters` (a plain file)."""
    b = SysfsBuilder(root)
    b.nic("0000:17:00.0", "ens1f0", host_bridge="pci0000:16", numa=0)
    b.nic("0000:17:00.1", "ens1f1", host_bridge="pci0000:16", numa=0)
    b.virtual("bond0", kind="bond", lower=["ens1f0", "ens1f1"], mtu=9000)
    b.virtual("bond0.100", kind="vlan", lower=["bond0"], mtu=9000)
    b.virtual("br0", kind="bridge", operstate="down", flags="0x1002")
    b.virtual("veth1a2b", operstate="lowerlayerdown", flags="0x1003")
    b.virtual("lo", mtu=65536, operstate="unknown", flags="0x9")
    b.write("/sys/class/net/bonding_masters", "bond0")
    return b


def numa_unknown(root: Path) -> SysfsBuilder:
    """A NIC whose numa_node is -1 and which has no local_cpulist."""
    b = SysfsBuilder(root)
    b.nic("0000:17:00.0", "ens1np0", host_bridge="pci0000:16", numa=None, rdma="mlx5_0")
    return b


def platform_rdma(root: Path) -> SysfsBuilder:
    """The seed's hard case: a SoC NIC end0 whose RDMA engine hns_0 hangs from the same platform device
    (`/sys/devices/platform/soc/fe1c0000.ethernet/{net/end0,infiniband/hns_0}`); no PCI function at all."""
    b = SysfsBuilder(root)
    b.platform("end0", "soc/fe1c0000.ethernet", mtu=9000)
    b.platform_rdma("soc/fe1c0000.ethernet", "hns_0", verbs=0)
    b.virtual("lo", mtu=65536, operstate="unknown", flags="0x9")
    b.rdma_cm()
    return b


def split_platform_rdma(root: Path) -> SysfsBuilder:
    """A platform RDMA engine whose ports ride on netdevs of other platform devices (HiSilicon hip06
    style): hns_0 port 1 -> eth0 (ACTIVE), port 2 -> eth1 (DOWN), told only by the ports' GID netdevs."""
    b = SysfsBuilder(root)
    b.platform("eth0", "HISI00C2:00")
    b.platform("eth1", "HISI00C2:01", operstate="down")
    b.platform_rdma(
        "HISI00D1:00",
        "hns_0",
        ports=[
            Port(gid_netdevs=("eth0", "eth0")),
            Port(state="DOWN", phys_state="Disabled", gid_netdevs=(None, "eth1")),
        ],
        verbs=0,
    )
    return b


def soft_rdma(root: Path) -> SysfsBuilder:
    """Soft-RoCE: rxe0 riding on a VM's virtio-net eth0 (its `parent`), nothing else RDMA on the node."""
    b = SysfsBuilder(root)
    b.virtio("eth0", "0000:00:03.0", index=0)
    b.soft_rdma("rxe0", "eth0", ports=[Port(gid_netdevs=("eth0",))], verbs=0)
    b.virtual("lo", mtu=65536, operstate="unknown", flags="0x9")
    b.rdma_cm()
    return b


def pf_without_netdev(root: Path) -> SysfsBuilder:
    """A ConnectX PF bound to vfio-pci (no netdev, no RDMA device of its own on the host) whose two VFs
    have netdevs and RDMA devices: the VFs are listed at top level, and are still VFs."""
    b = SysfsBuilder(root)
    b.nic("0000:5e:00.0", None, host_bridge="pci0000:5d", numa=1, cpus=CPUS[1])
    b.mkdir("/sys/bus/pci/drivers/vfio-pci")
    b.link(b.functions["0000:5e:00.0"] / "driver", "/sys/bus/pci/drivers/vfio-pci")
    b.sriov(
        "0000:5e:00.0",
        vfs=2,
        numa=1,
        netdev_prefix="ens3f0v",
        rdma_prefix="mlx5_",
        first_rdma=0,
        first_verbs=0,
    )
    b.rdma_cm()
    return b


def bench(root: Path, *, pfs: int = 8, vfs: int = 128) -> SysfsBuilder:
    """The benchmark tree: `pfs` PFs with RDMA, each with `vfs` VFs with a netdev and an RDMA device."""
    b = SysfsBuilder(root)
    for p in range(pfs):
        bus = 0x10 + p * 0x10
        b.bridge(_bdf(bus, 1), host_bridge=f"pci0000:{bus:02x}")
        pf = _bdf(bus + 1)
        b.nic(
            pf, f"ens{p}f0np0", parent=_bdf(bus, 1), numa=p % 2, cpus=CPUS[p % 2], rdma=f"mlx5_{p}", verbs=p
        )
        b.sriov(
            pf, vfs=vfs, numa=p % 2, netdev_prefix=f"ens{p}f0v", rdma_prefix="mlx5_", first_rdma=pfs + p * vfs
        )
    return b


SCENARIOS: dict[str, Callable[[Path], SysfsBuilder]] = {
    "gpu8": gpu8,
    "two-level": two_level,
    "sriov": sriov,
    "vf-only-rdma": vf_only_rdma,
    "active-defer": active_defer,
    "down-beside-working": down_beside_working,
    "unreadable-rdma": unreadable_rdma,
    "escaping-symlink": escaping_symlink,
    "big-attribute": big_attribute,
    "non-pci": non_pci,
    "virtual-interfaces": virtual_interfaces,
    "numa-unknown": numa_unknown,
    "platform-rdma": platform_rdma,
    "split-platform-rdma": split_platform_rdma,
    "soft-rdma": soft_rdma,
    "pf-without-netdev": pf_without_netdev,
}
