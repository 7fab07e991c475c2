"""The walk over SR-IOV virtual functions gives the record the code before its VF shortcuts gave: hostile
trees whose damage is on a VF, its netdev, its RDMA device, its links, or the PF's virtfn links, each
printed by `nodefabric inventory -o json` byte for byte as before (exit code included).

test_dm_walk_golden.py damages only a PF; the shortcuts a walk takes per VF (a function resolved once,
its attributes read in one call, its netdev and RDMA device listed through the directories it already
holds) must refuse what the general path refuses. The goldens under golden/walk_vf/ are not written by
hand: `python tests/devicemanager/test_dm_walk_vf_golden.py` regenerates them from whatever code is
installed, and they were produced by main's code (commit ea640b1) before the VF shortcuts (run with
PYTHONPATH pointing at a checkout of it).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from walk_documents import assert_matches_golden, built, document

from nodefabric_devicemanager.testing.scenarios import bench
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder

GOLDEN = Path(__file__).parent / "golden" / "walk_vf"
BRIDGE = "/sys/devices/pci0000:10/0000:10:01.0"
PF = f"{BRIDGE}/0000:11:00.0"
VF = f"{BRIDGE}/0000:11:00.1"
OTHER_VF = f"{BRIDGE}/0000:11:00.2"
VF_NET = f"{VF}/net"
VF_NETDEV = f"{VF_NET}/ens0f0v0"
VF_IB = f"{VF}/infiniband"
VF_RDMA = f"{VF_IB}/mlx5_1"
VF_PORT = f"{VF_RDMA}/ports/1"
BUS = "/sys/bus/pci/devices"


def _loop(b: SysfsBuilder, path: str) -> None:
    where = b.path(path)
    if where.is_dir() and not where.is_symlink():
        shutil.rmtree(where)
    else:
        where.unlink(missing_ok=True)
    os.symlink(path.rpartition("/")[2], where)


def _swap(b: SysfsBuilder, path: str, by: str, target: str = "") -> None:
    """Replace what is at `path` (a file, a directory or a link) by: a regular file, a directory, a FIFO, a
    link to `target` (host-absolute, stored relative; "outside" lands beside the root), a dangling link,
    a looping link, or a link to a renamed copy beside it ("link-inside")."""
    where = b.path(path)
    if by == "link-inside":
        where.rename(where.with_name(where.name + ".real"))
        os.symlink(where.name + ".real", where)
        return
    if where.is_dir() and not where.is_symlink():
        shutil.rmtree(where)
    else:
        where.unlink(missing_ok=True)
    if by == "file":
        where.write_text("x\n")
    elif by == "dir":
        where.mkdir()
    elif by == "fifo":
        os.mkfifo(where)
    elif by == "dangling":
        os.symlink("gone", where)
    elif by == "loop":
        os.symlink(where.name, where)
    elif by == "outside":
        outside = b.root.parent / "outside"
        outside.mkdir(exist_ok=True)
        (outside / "vendor").write_text("0x15b3\n")
        os.symlink(os.path.relpath(outside, where.parent), where)
    else:
        b.link(path, target)


def _outside_copy(b: SysfsBuilder, path: str) -> None:
    """The directory at `path` moved outside the root, a link left in its place."""
    where = b.path(path)
    outside = b.root.parent / "outside-copy"
    shutil.move(where, outside)
    os.symlink(os.path.relpath(outside, where.parent), where)


def _relink(b: SysfsBuilder, text: str) -> None:
    """/sys/class/net/ens0f0v0 (the first VF's netdev) relinked with `text`, verbatim."""
    link = b.path("/sys/class/net/ens0f0v0")
    link.unlink()
    os.symlink(text, link)


def _down(b: SysfsBuilder) -> None:
    b.write(f"{VF_PORT}/state", "1: DOWN")
    b.write(f"{VF_PORT}/phys_state", "3: Disabled")


def _non_utf8_netdev(b: SysfsBuilder) -> None:
    old = b.path(VF_NETDEV)
    new = old.with_name(os.fsdecode(b"ens\xff0v0"))
    old.rename(new)
    link = b.path("/sys/class/net/ens0f0v0")
    link.unlink()
    os.symlink(os.path.relpath(new, link.parent), b.root / os.fsdecode(b"sys/class/net/ens\xff0v0"))


def _copy_named_like_other_vf(b: SysfsBuilder, text: str, alias: str = "") -> None:
    """The second VF's virtfn link relinked with `text`, verbatim, to a copy of that VF outside the PCI
    walk (not under /sys/bus/pci/devices) named like it, whose netdev has another name and mtu: a VF the
    walk did not resolve is read from where the link lands, never from the walk's function of that name.
    `alias`: a link under /sys/devices to the copy, for `text` to go through."""
    copy = b.path("/sys/devices/elsewhere/0000:11:00.2")
    shutil.copytree(b.path(OTHER_VF), copy, symlinks=True)
    (copy / "net/ens0f0v1").rename(copy / "net/copy0")
    (copy / "net/copy0/mtu").write_text("1234\n")
    if alias:
        os.symlink("elsewhere/0000:11:00.2", b.path(f"/sys/devices/{alias}"))
    link = b.path(f"{PF}/virtfn1")
    link.unlink()
    os.symlink(text, link)


HOSTILE: dict[str, Callable[[SysfsBuilder], object]] = {
    # The VF's own attributes.
    "vf-fifo-vendor": lambda b: b.fifo(f"{VF}/vendor"),
    "vf-chardev-numa-node": lambda b: b.chardev(f"{VF}/numa_node"),
    "vf-loop-device-id": lambda b: _loop(b, f"{VF}/device"),
    "vf-escape-class": lambda b: _swap(b, f"{VF}/class", "outside"),
    "vf-link-vendor-inside": lambda b: (
        b.write("/sys/devices/other-vendor", "0x8086"),
        _swap(b, f"{VF}/vendor", "link", "/sys/devices/other-vendor"),
    ),
    "vf-directory-vendor": lambda b: _swap(b, f"{VF}/vendor", "dir"),
    "vf-zeros-numa-node": lambda b: b.write(f"{VF}/numa_node", b"\0" * (80 * 1024)),
    "vf-garbage-vendor": lambda b: b.write(f"{VF}/vendor", b"0x15\xb3\n"),
    "vf-empty-vendor": lambda b: b.write(f"{VF}/vendor", b""),
    "vf-numa-minus-one": lambda b: b.write(f"{VF}/numa_node", "-1"),
    "vf-numa-huge": lambda b: b.write(f"{VF}/numa_node", "1" * 5000),
    "vf-cpulist-present": lambda b: b.write(f"{VF}/local_cpulist", "0-3,8-11"),
    "vf-cpulist-garbage": lambda b: b.write(f"{VF}/local_cpulist", "3-1"),
    # Its links.
    "vf-physfn-not-a-function": lambda b: _swap(b, f"{VF}/physfn", "link", BRIDGE),
    "vf-physfn-file": lambda b: _swap(b, f"{VF}/physfn", "file"),
    "vf-physfn-missing": lambda b: b.path(f"{VF}/physfn").unlink(),
    "vf-physfn-other-vf": lambda b: _swap(b, f"{VF}/physfn", "link", OTHER_VF),
    "vf-subsystem-platform": lambda b: _swap(b, f"{VF}/subsystem", "link", "/sys/bus/platform"),
    "vf-subsystem-missing": lambda b: b.path(f"{VF}/subsystem").unlink(),
    "bus-link-escapes": lambda b: _swap(b, f"{BUS}/0000:11:00.1", "outside"),
    "bus-link-dangling": lambda b: _swap(b, f"{BUS}/0000:11:00.1", "dangling"),
    "bus-link-loop": lambda b: _swap(b, f"{BUS}/0000:11:00.1", "loop"),
    "bus-link-other-vf": lambda b: _swap(b, f"{BUS}/0000:11:00.1", "link", OTHER_VF),
    "bus-link-file": lambda b: _swap(b, f"{BUS}/0000:11:00.1", "file"),
    "bus-link-fifo": lambda b: _swap(b, f"{BUS}/0000:11:00.1", "fifo"),
    "vf-dir-linked-inside": lambda b: _swap(b, VF, "link-inside"),
    "vf-dir-outside": lambda b: _outside_copy(b, VF),
    "virtfn-dangling": lambda b: _swap(b, f"{PF}/virtfn0", "dangling"),
    "virtfn-loop": lambda b: _swap(b, f"{PF}/virtfn0", "loop"),
    "virtfn-escapes": lambda b: _swap(b, f"{PF}/virtfn0", "outside"),
    "virtfn-to-pf": lambda b: _swap(b, f"{PF}/virtfn0", "link", PF),
    "virtfn-twice": lambda b: _swap(b, f"{PF}/virtfn1", "link", VF),
    "virtfn-odd-names": lambda b: (
        b.link(f"{PF}/virtfn01", OTHER_VF),
        b.link(f"{PF}/virtfnx", OTHER_VF),
        b.link(f"{PF}/virtfn99999", OTHER_VF),
    ),
    "virtfn-file": lambda b: _swap(b, f"{PF}/virtfn0", "file"),
    # A copy of a VF the walk holds, beside it under another parent, reached by a virtfn link the walk's
    # map does not name: read from the copy (its netdev), not from the walk's function of that name.
    "virtfn-to-a-copy-trailing-slash": lambda b: _copy_named_like_other_vf(
        b, "../../../elsewhere/0000:11:00.2/"
    ),
    "virtfn-to-a-copy-through-an-alias": lambda b: _copy_named_like_other_vf(b, "../../../alias", "alias"),
    "sriov-numvfs-garbage": lambda b: b.write(f"{PF}/sriov_numvfs", "lots"),
    "sriov-numvfs-fifo": lambda b: b.fifo(f"{PF}/sriov_numvfs"),
    # Its netdev.
    "vf-fifo-mtu": lambda b: b.fifo(f"{VF_NETDEV}/mtu"),
    "vf-chardev-operstate": lambda b: b.chardev(f"{VF_NETDEV}/operstate"),
    "vf-directory-mtu": lambda b: _swap(b, f"{VF_NETDEV}/mtu", "dir"),
    "vf-loop-flags": lambda b: _loop(b, f"{VF_NETDEV}/flags"),
    "vf-escape-operstate": lambda b: _swap(b, f"{VF_NETDEV}/operstate", "outside"),
    "vf-nul-mtu": lambda b: b.write(f"{VF_NETDEV}/mtu", b"9000\0"),
    "vf-garbage-operstate": lambda b: b.write(f"{VF_NETDEV}/operstate", b"\xff\xfeup\n"),
    "vf-unknown-operstate-flags-up": lambda b: (
        b.write(f"{VF_NETDEV}/operstate", "unknown"),
        b.write(f"{VF_NETDEV}/flags", "0x1003"),
    ),
    "vf-unknown-operstate-flags-down": lambda b: (
        b.write(f"{VF_NETDEV}/operstate", "unknown"),
        b.write(f"{VF_NETDEV}/flags", "0x1002"),
    ),
    "vf-missing-flags": lambda b: (
        b.write(f"{VF_NETDEV}/operstate", "unknown"),
        b.path(f"{VF_NETDEV}/flags").unlink(),
    ),
    "vf-missing-mtu": lambda b: b.path(f"{VF_NETDEV}/mtu").unlink(),
    "vf-net-dangling": lambda b: _swap(b, VF_NET, "dangling"),
    "vf-net-fifo": lambda b: _swap(b, VF_NET, "fifo"),
    "vf-net-file": lambda b: _swap(b, VF_NET, "file"),
    "vf-net-linked-inside": lambda b: _swap(b, VF_NET, "link-inside"),
    "vf-net-outside": lambda b: _outside_copy(b, VF_NET),
    "vf-net-empty": lambda b: (shutil.rmtree(b.path(VF_NETDEV)), b.path("/sys/class/net/ens0f0v0").unlink()),
    "vf-netdev-linked-inside": lambda b: _swap(b, VF_NETDEV, "link-inside"),
    "vf-netdev-file": lambda b: _swap(b, VF_NETDEV, "file"),
    "vf-netdev-second": lambda b: b.mkdir(f"{VF_NET}/ens0f0v0a"),
    "vf-netdev-non-utf8": _non_utf8_netdev,
    "vf-class-net-missing": lambda b: b.path("/sys/class/net/ens0f0v0").unlink(),
    "vf-class-net-other-vf": lambda b: _swap(
        b, "/sys/class/net/ens0f0v0", "link", f"{OTHER_VF}/net/ens0f0v1"
    ),
    "vf-class-net-escapes": lambda b: _swap(b, "/sys/class/net/ens0f0v0", "outside"),
    # /sys/class/net links whose text is not the plain `../../devices/<function>/net/<name>`.
    "class-net-via-linked-bridge": lambda b: (
        os.symlink("0000:10:01.0", b.path("/sys/devices/pci0000:10/bridge-alias")),
        _relink(b, "../../devices/pci0000:10/bridge-alias/0000:11:00.1/net/ens0f0v0"),
    ),
    "class-net-dot-component": lambda b: _relink(
        b, "../../devices/./pci0000:10/0000:10:01.0/0000:11:00.1/net/ens0f0v0"
    ),
    "class-net-double-slash": lambda b: _relink(
        b, "../../devices//pci0000:10/0000:10:01.0/0000:11:00.1/net/ens0f0v0"
    ),
    "class-net-up-through-the-root": lambda b: _relink(b, "../" * 40 + str(b.path(VF_NETDEV)).lstrip("/")),
    "class-net-other-name": lambda b: _relink(
        b, "../../devices/pci0000:10/0000:10:01.0/0000:11:00.2/net/ens0f0v1"
    ),
    "class-net-to-net-directory": lambda b: _relink(
        b, "../../devices/pci0000:10/0000:10:01.0/0000:11:00.1/net"
    ),
    "vf-device-dangling": lambda b: _swap(b, f"{VF_NETDEV}/device", "dangling"),
    "vf-device-other-vf": lambda b: _swap(b, f"{VF_NETDEV}/device", "link", OTHER_VF),
    "vf-device-pf": lambda b: _swap(b, f"{VF_NETDEV}/device", "link", PF),
    "vf-device-file": lambda b: _swap(b, f"{VF_NETDEV}/device", "file"),
    "vf-device-escapes": lambda b: _swap(b, f"{VF_NETDEV}/device", "outside"),
    # Its RDMA device.
    "vf-fifo-port-state": lambda b: b.fifo(f"{VF_PORT}/state"),
    "vf-directory-phys-state": lambda b: _swap(b, f"{VF_PORT}/phys_state", "dir"),
    "vf-loop-port-state": lambda b: _loop(b, f"{VF_PORT}/state"),
    "vf-escape-phys-state": lambda b: _swap(b, f"{VF_PORT}/phys_state", "outside"),
    "vf-missing-phys-state": lambda b: b.path(f"{VF_PORT}/phys_state").unlink(),
    "vf-port-down": _down,
    "vf-port-garbage": lambda b: b.write(f"{VF_PORT}/state", "4: ACTIVE\0junk"),
    "vf-port-long": lambda b: b.write(f"{VF_PORT}/state", "9: " + "X" * 300),
    "vf-second-port": lambda b: (
        _down(b),
        b.mkdir(f"{VF_RDMA}/ports/2"),
        b.write(f"{VF_RDMA}/ports/2/state", "4: ACTIVE"),
        b.write(f"{VF_RDMA}/ports/2/phys_state", "5: LinkUp"),
    ),
    "vf-ports-in-number-order": lambda b: (
        _down(b),
        *(b.mkdir(f"{VF_RDMA}/ports/{n}") for n in (2, 10)),
        *(b.write(f"{VF_RDMA}/ports/{n}/state", "1: DOWN") for n in (2, 10)),
        *(b.write(f"{VF_RDMA}/ports/{n}/phys_state", "2: Polling") for n in (2, 10)),
    ),
    "vf-port-named-oddly": lambda b: (_down(b), b.mkdir(f"{VF_RDMA}/ports/abc")),
    "vf-port-file": lambda b: (_down(b), b.write(f"{VF_RDMA}/ports/3", "x")),
    "vf-port-linked-inside": lambda b: _swap(b, VF_PORT, "link-inside"),
    "vf-port-dangling": lambda b: _swap(b, VF_PORT, "dangling"),
    "vf-ports-dangling": lambda b: _swap(b, f"{VF_RDMA}/ports", "dangling"),
    "vf-ports-file": lambda b: _swap(b, f"{VF_RDMA}/ports", "file"),
    "vf-ports-missing": lambda b: shutil.rmtree(b.path(f"{VF_RDMA}/ports")),
    "vf-ports-empty": lambda b: shutil.rmtree(b.path(VF_PORT)),
    "vf-ports-linked-inside": lambda b: _swap(b, f"{VF_RDMA}/ports", "link-inside"),
    "vf-rdma-linked-inside": lambda b: _swap(b, VF_RDMA, "link-inside"),
    "vf-rdma-file": lambda b: _swap(b, VF_RDMA, "file"),
    "vf-rdma-dangling": lambda b: _swap(b, VF_RDMA, "dangling"),
    "vf-rdma-second": lambda b: b.mkdir(f"{VF_IB}/mlx5_0a"),
    "vf-infiniband-empty": lambda b: shutil.rmtree(b.path(VF_RDMA)),
    "vf-infiniband-fifo": lambda b: _swap(b, VF_IB, "fifo"),
    "vf-infiniband-file": lambda b: _swap(b, VF_IB, "file"),
    "vf-infiniband-dangling": lambda b: _swap(b, VF_IB, "dangling"),
    "vf-infiniband-linked-inside": lambda b: _swap(b, VF_IB, "link-inside"),
    "vf-infiniband-outside": lambda b: _outside_copy(b, VF_IB),
    "vf-infiniband-missing": lambda b: shutil.rmtree(b.path(VF_IB)),
}


def _tree(change: Callable[[SysfsBuilder], object]) -> Callable[[Path], None]:
    def build(root: Path) -> None:
        b = bench(root, pfs=1, vfs=2)
        change(b)

    return build


TREES: dict[str, Callable[[Path], object]] = {
    "bench-1x2": lambda root: bench(root, pfs=1, vfs=2),
    "bench-2x40": lambda root: bench(root, pfs=2, vfs=40),
    **{name: _tree(change) for name, change in HOSTILE.items()},
}


def _build(name: str, base: Path) -> Path:
    return built(TREES, name, base)


@pytest.mark.parametrize("name", sorted(TREES))
def test_a_damaged_vf_prints_what_the_code_before_the_vf_shortcuts_printed(name: str, tmp_path: Path) -> None:
    assert_matches_golden(TREES, GOLDEN, name, tmp_path)


def test_every_golden_belongs_to_a_tree() -> None:
    assert {p.stem for p in GOLDEN.glob("*.txt")} == set(TREES)


def test_the_damage_is_where_the_tree_says() -> None:
    """Each hostile tree differs from the clean one: a change that silently did nothing (a path that no
    longer names anything in the bench tree) would leave a golden that proves nothing."""
    clean = (GOLDEN / "bench-1x2.txt").read_text(encoding="utf-8")
    same = [name for name in HOSTILE if (GOLDEN / f"{name}.txt").read_text(encoding="utf-8") == clean]
    assert set(same) <= ALLOWED_SAME, sorted(set(same) - ALLOWED_SAME)


# Damage the record does not show, and says so: a directory or attribute linked to an identical one
# inside the root is followed; a second netdev directory sorts after the VF's own; virtfn names that are
# not a VF index are not VF links; a garbage sriov_numvfs is counted from the virtfn links (2 either
# way); a cpulist a VF does not carry; a netdev found through its VF whatever /sys/class/net says of it.
ALLOWED_SAME = {
    # A /sys/class/net link spelled another way to the same directory is that directory.
    "class-net-dot-component",
    "class-net-double-slash",
    "class-net-up-through-the-root",
    "class-net-via-linked-bridge",
    "sriov-numvfs-garbage",
    "vf-class-net-missing",
    "vf-cpulist-garbage",
    "vf-device-other-vf",
    "vf-infiniband-linked-inside",
    "vf-net-linked-inside",
    "vf-netdev-second",
    "vf-port-linked-inside",
    "vf-ports-linked-inside",
    "vf-unknown-operstate-flags-up",
    "virtfn-odd-names",
}


if __name__ == "__main__":
    import tempfile

    GOLDEN.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for tree in sorted(TREES):
            (GOLDEN / f"{tree}.txt").write_text(document(_build(tree, Path(tmp))), encoding="utf-8")
    print(f"wrote {len(TREES)} goldens to {GOLDEN}", file=sys.stderr)
