"""The record a walk yields does not change when the walk gets faster: `nodefabric inventory -o json` over
every fixture scenario, the benchmark tree and a set of hostile trees is byte-identical to what the code
before the host-walk rework printed (its exit code included).

The goldens under golden/walk/ are not written by hand: `python tests/devicemanager/test_dm_walk_golden.py
DIR` regenerates them from whatever code is installed, and they were produced by main's code (commit
d949c4b) before the syscall pattern of hostroot.py changed. Regenerate them only for a change that means
to change the record, and say so in its commit.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from walk_documents import assert_matches_golden, built, document

from nodefabric_devicemanager.testing.scenarios import SCENARIOS, bench
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder

GOLDEN = Path(__file__).parent / "golden" / "walk"
NIC = "/sys/devices/pci0000:16/0000:17:00.0"
NETDEV = f"{NIC}/net/ens1np0"
PORT = f"{NIC}/infiniband/mlx5_0/ports/1"


def _nic(b: SysfsBuilder) -> None:
    b.nic("0000:17:00.0", "ens1np0", host_bridge="pci0000:16", numa=0, rdma="mlx5_0", verbs=0)
    b.write(f"{NIC}/sriov_totalvfs", "8")


def _hostile(change: Callable[[SysfsBuilder], object]) -> Callable[[Path], None]:
    def build(root: Path) -> None:
        b = SysfsBuilder(root)
        _nic(b)
        change(b)

    return build


def _replace_with_dir(b: SysfsBuilder, path: str) -> None:
    b.path(path).unlink()
    b.mkdir(path)


def _loop(b: SysfsBuilder, path: str) -> None:
    b.path(path).unlink()
    os.symlink(path.rpartition("/")[2], b.path(path))


def _escape_via_directory(b: SysfsBuilder) -> None:
    # A directory component (the interface's `device`) that leaves the root: the attributes behind it
    # would be read from outside.
    outside = b.root.parent / "outside"
    (outside / "net/ens1np0").mkdir(parents=True, exist_ok=True)
    (outside / "vendor").write_text("0x15b3\n")
    dev = b.path(f"{NETDEV}/device")
    dev.unlink()
    dev.symlink_to(os.path.relpath(outside, dev.parent))


def _replace_dir(b: SysfsBuilder, path: str, by: str) -> None:
    """A directory the walk lists replaced: by a dangling link, a link to a directory beside it, a
    regular file or a FIFO."""
    where = b.path(path)
    if by == "link-inside":
        where.rename(where.with_name(where.name + ".real"))
        os.symlink(where.name + ".real", where)
        return
    shutil.rmtree(where)
    if by == "dangling":
        os.symlink("gone", where)
    elif by == "file":
        where.write_text("x\n")
    else:
        os.mkfifo(where)


def _symlink_to_chardev(b: SysfsBuilder) -> None:
    b.chardev("/dev/watchdog")
    b.path(f"{NIC}/local_cpulist").unlink(missing_ok=True)
    b.link(f"{NIC}/local_cpulist", "/dev/watchdog")


def _non_utf8_interface(b: SysfsBuilder) -> None:
    b.path("/sys/class/net/ens1np0").rename(b.root / os.fsdecode(b"sys/class/net/ens\xff1"))


HOSTILE: dict[str, Callable[[SysfsBuilder], object]] = {
    "fifo-mtu": lambda b: b.fifo(f"{NETDEV}/mtu"),
    "fifo-numa-node": lambda b: b.fifo(f"{NIC}/numa_node"),
    "fifo-sriov-numvfs": lambda b: b.fifo(f"{NIC}/sriov_numvfs"),
    "fifo-port-state": lambda b: b.fifo(f"{PORT}/state"),
    "chardev-numa-node": lambda b: b.chardev(f"{NIC}/numa_node"),
    "chardev-operstate": lambda b: b.chardev(f"{NETDEV}/operstate"),
    "symlink-to-chardev": _symlink_to_chardev,
    "loop-vendor": lambda b: _loop(b, f"{NIC}/vendor"),
    "loop-port-state": lambda b: _loop(b, f"{PORT}/state"),
    "escape-attribute": lambda b: (
        b.path(f"{NIC}/class").unlink(),
        os.symlink("../../../../../secret", b.path(f"{NIC}/class")),
    ),
    "escape-directory": _escape_via_directory,
    "directory-mtu": lambda b: _replace_with_dir(b, f"{NETDEV}/mtu"),
    "directory-phys-state": lambda b: _replace_with_dir(b, f"{PORT}/phys_state"),
    "zeros-local-cpulist": lambda b: b.write(f"{NIC}/local_cpulist", b"\0" * (80 * 1024)),
    "nul-mtu": lambda b: b.write(f"{NETDEV}/mtu", b"9000\0"),
    "garbage-operstate": lambda b: b.write(f"{NETDEV}/operstate", b"\xff\xfeup\n"),
    "garbage-vendor": lambda b: b.write(f"{NIC}/vendor", b"0x15\xb3\n"),
    "empty-vendor": lambda b: b.write(f"{NIC}/vendor", b""),
    "missing-flags": lambda b: b.path(f"{NETDEV}/flags").unlink(),
    "dangling-device": lambda b: (
        b.path(f"{NETDEV}/device").unlink(),
        os.symlink("../../../gone", b.path(f"{NETDEV}/device")),
    ),
    "fifo-class-net-entry": lambda b: b.fifo("/sys/class/net/ens9"),
    "dangling-ports": lambda b: _replace_dir(b, f"{NIC}/infiniband/mlx5_0/ports", "dangling"),
    "file-ports": lambda b: _replace_dir(b, f"{NIC}/infiniband/mlx5_0/ports", "file"),
    "fifo-infiniband": lambda b: _replace_dir(b, f"{NIC}/infiniband", "fifo"),
    "linked-infiniband": lambda b: _replace_dir(b, f"{NIC}/infiniband", "link-inside"),
    "linked-port": lambda b: _replace_dir(b, PORT, "link-inside"),
    "dangling-net": lambda b: _replace_dir(b, f"{NIC}/net", "dangling"),
    "non-utf8-interface": _non_utf8_interface,
}

TREES: dict[str, Callable[[Path], object]] = {
    **{f"scenario-{name}": build for name, build in SCENARIOS.items()},
    "bench-2x3": lambda root: bench(root, pfs=2, vfs=3),
    **{f"hostile-{name}": _hostile(change) for name, change in HOSTILE.items()},
}


def _build(name: str, base: Path) -> Path:
    return built(TREES, name, base)


@pytest.mark.parametrize("name", sorted(TREES))
def test_the_walk_prints_what_the_code_before_it_printed(name: str, tmp_path: Path) -> None:
    assert_matches_golden(TREES, GOLDEN, name, tmp_path)


def test_every_golden_belongs_to_a_tree() -> None:
    assert {p.stem for p in GOLDEN.glob("*.txt")} == set(TREES)


if __name__ == "__main__":
    import tempfile

    GOLDEN.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for tree in sorted(TREES):
            (GOLDEN / f"{tree}.txt").write_text(document(_build(tree, Path(tmp))), encoding="utf-8")
    print(f"wrote {len(TREES)} goldens to {GOLDEN}", file=sys.stderr)
