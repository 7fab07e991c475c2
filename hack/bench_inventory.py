"""Benchmark: one full inventory pass over a generated 8 PF x 128 VF tree with RDMA devices, against a
bare baseline in the same run that lists and reads the same files with os.scandir/open and nothing else.

    .venv/bin/python hack/bench_inventory.py [--pfs 8] [--vfs 128] [--rounds 7] [--profile]

Prints the median of each, and the ratio (target: pass <= 1.5x baseline). Then what the reader's safety
costs per attribute, against a bare open/read/close of the same files in the same run: the safe read
checks the type before opening (lstat), opens non-blocking and re-checks with fstat, caps the size and
decodes strictly, so a FIFO or a device node can never hang a pass.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

from nodefabric_devicemanager import interfaces, pci
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.testing.scenarios import bench

PCI_ATTRS = ("vendor", "device", "class", "numa_node", "local_cpulist")
NET_ATTRS = ("mtu", "operstate", "flags")


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(65537).decode()
    except FileNotFoundError:
        return None


def _readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def _rdma(fn: str) -> None:
    ib = os.path.join(fn, "infiniband")
    if not os.path.isdir(ib):
        return
    for dev in sorted(e.name for e in os.scandir(ib)):
        ports = os.path.join(ib, dev, "ports")
        for port in sorted(e.name for e in os.scandir(ports)):
            _read(os.path.join(ports, port, "state"))
            _read(os.path.join(ports, port, "phys_state"))


def _function(fn: str) -> None:
    _rdma(fn)
    _read(os.path.join(fn, "sriov_numvfs"))
    os.path.exists(os.path.join(fn, "sriov_totalvfs"))


def baseline(root: str) -> int:
    """The same files the pass reads, with no resolution, validation, caps or models."""
    bus = os.path.join(root, "sys/bus/pci/devices")
    for entry in sorted(e.name for e in os.scandir(bus)):
        fn = os.path.join(bus, entry)
        for attr in PCI_ATTRS:
            _read(os.path.join(fn, attr))
        _readlink(os.path.join(fn, "physfn"))
    count = 0
    net = os.path.join(root, "sys/class/net")
    for entry in sorted(e.name for e in os.scandir(net)):
        d = os.path.join(net, entry)
        if not os.path.isdir(d):
            continue
        dev = os.path.join(d, "device")
        if os.path.exists(os.path.join(dev, "physfn")):
            continue  # a VF: read under its PF below
        for attr in NET_ATTRS:
            _read(os.path.join(d, attr))
        count += 1
        _readlink(os.path.join(dev, "subsystem"))
        _function(dev)
        for link in sorted(e.name for e in os.scandir(dev) if e.name.startswith("virtfn")):
            vf = os.path.join(dev, link)
            _function(vf)
            netdir = os.path.join(vf, "net")
            for name in sorted(e.name for e in os.scandir(netdir)) if os.path.isdir(netdir) else []:
                for attr in NET_ATTRS:
                    _read(os.path.join(netdir, name, attr))
            count += 1
    return count


def full_pass(root: str) -> int:
    host = HostRoot.at(root)
    found = interfaces.read(host, pci.walk(host))
    return sum(1 + len(i.virtual_functions) for i in found)


def attribute_paths(root: str) -> list[str]:
    """Every PCI function's identity attributes: the reads a pass makes most of."""
    bus = os.path.join(root, "sys/bus/pci/devices")
    return [os.path.join(bus, fn, attr) for fn in sorted(os.listdir(bus)) for attr in PCI_ATTRS[:4]]


def safe_reads(root: str) -> int:
    host = HostRoot.at(root)
    bus = host.dir("/sys/bus/pci/devices")
    dirs = [bus.child(name) for name in sorted(bus.list())]
    start = time.perf_counter()
    for d in dirs:
        for attr in PCI_ATTRS[:4]:
            d.read(attr)
    return time.perf_counter() - start, len(dirs) * 4


def bare_reads(root: str) -> tuple[float, int]:
    paths = [
        os.path.join(os.path.realpath(os.path.dirname(p)), os.path.basename(p)) for p in attribute_paths(root)
    ]
    start = time.perf_counter()
    for p in paths:
        # What the reader did before its safety checks: open, one read, close, decode.
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.read(fd, 65537).decode("utf-8", errors="replace")
        finally:
            os.close(fd)
    return time.perf_counter() - start, len(paths)


def timed(fn, root: str, rounds: int) -> tuple[float, int]:
    times, result = [], 0
    for _ in range(rounds):
        start = time.perf_counter()
        result = fn(root)
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pfs", type=int, default=8)
    ap.add_argument("--vfs", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = str(Path(tmp) / "root")
        bench(Path(root), pfs=args.pfs, vfs=args.vfs)
        full_pass(root), baseline(root)  # warm the page and dentry caches for both alike
        if args.profile:
            prof = cProfile.Profile()
            prof.runcall(full_pass, root)
            pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
        # Interleave so drift on a shared machine hits both alike.
        base_times, pass_times = [], []
        for _ in range(args.rounds):
            b, n_base = timed(baseline, root, 1)
            p, n_pass = timed(full_pass, root, 1)
            base_times.append(b)
            pass_times.append(p)
        if n_base != n_pass:
            print(f"endpoint counts differ: baseline {n_base}, pass {n_pass}", file=sys.stderr)
            return 1
        base, full = statistics.median(base_times), statistics.median(pass_times)
        safe_times, bare_times, reads = [], [], 0
        for _ in range(args.rounds):
            b, reads = bare_reads(root)
            s, _ = safe_reads(root)
            bare_times.append(b)
            safe_times.append(s)
        bare, safe = statistics.median(bare_times) / reads, statistics.median(safe_times) / reads
        print(f"tree: {args.pfs} PFs x {args.vfs} VFs with RDMA devices, {n_pass} endpoints")
        print(f"baseline (scandir/open): {base * 1000:8.1f} ms")
        print(f"inventory pass:          {full * 1000:8.1f} ms")
        print(f"ratio:                   {full / base:8.2f}x (target <= 1.50x)")
        print(f"attribute, bare os.open: {bare * 1e6:8.2f} us ({reads} reads)")
        print(f"attribute, safe read:    {safe * 1e6:8.2f} us (type check, O_NONBLOCK, fstat, cap, UTF-8)")
        print(f"safety cost per read:    {safe / bare:8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
