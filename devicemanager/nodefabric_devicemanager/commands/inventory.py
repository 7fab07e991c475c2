"""`nodefabric inventory`: read this host and print the Devices record it would publish."""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from typing import Any, TextIO

from nodefabric_devicemanager import inventory, summary
from nodefabric_devicemanager.commands import output
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import ACCELERATORS_ENUMERATED, Accelerator, Condition, Endpoint


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_root(parser)
    output.add_output(parser, default="json")


def add_root(parser: argparse.ArgumentParser) -> None:
    """The options every command that reads this host takes."""
    parser.add_argument("--root", default="/", help="host root to read /sys from (default: /)")
    parser.add_argument(
        "--driver-root",
        default=None,
        metavar="DIR",
        help="NVIDIA driver root to load libnvidia-ml.so.1 from, e.g. /run/nvidia/driver "
        "(default: $NVIDIA_DRIVER_ROOT, else the loader's own search)",
    )


def _not_a_directory(what: str, path: str) -> str | None:
    if os.path.isdir(path):
        return None
    why = " (nothing is there)" if not os.path.lexists(path) else ""
    return f"the {what} {path} is not a directory{why}"


def root_problem(root: str) -> str | None:
    """Why `--root` names no host root to read, or None. A typo is the user's error (exit 2), not a host
    whose /sys could not be enumerated (exit 1, with conditions that would blame the host)."""
    if not root:
        return "--root is empty (give a directory; / for this host)"
    return _not_a_directory("host root", root)


def driver_root_problem(driver_root: str | None) -> str | None:
    """Why `--driver-root` names no directory, or None (None: not given, $NVIDIA_DRIVER_ROOT or the
    loader's search decide). A typo there would otherwise read as a node without NVML, exit 0."""
    if driver_root is None:
        return None
    if not driver_root:
        return "--driver-root is empty (give the driver's directory, or leave the option out)"
    return _not_a_directory("driver root", driver_root)


def refused_root(prog: str, root: str, driver_root: str | None = None) -> bool:
    """Print the host root's (or the driver root's) problem as one line, if it has one; True when it did."""
    problem = root_problem(root) or driver_root_problem(driver_root)
    if problem is not None:
        print(output.one_line(f"{prog}: {problem}"), file=sys.stderr)
    return problem is not None


def read(args: argparse.Namespace) -> inventory.Reading:
    return inventory.read(HostRoot.at(args.root), driver_root=args.driver_root)


def accelerators_read(reading: inventory.Reading) -> bool:
    return all(c.status == "True" for c in reading.conditions if c.type == ACCELERATORS_ENUMERATED)


def failed(reading: inventory.Reading) -> bool:
    """The pass could not enumerate a part of the host (interfaces, or the accelerators on the bus).
    A vendor library that is missing is not a failed pass: the accelerators are still listed."""
    return reading.interfaces is None or not accelerators_read(reading)


def document(reading: inventory.Reading) -> dict[str, Any]:
    spec = reading.spec().wire()
    if reading.interfaces is None:
        # Not read is not empty: leave the key out so nobody reads "this host has no interfaces".
        del spec["interfaces"]
    if not accelerators_read(reading):
        del spec["groups"]  # the same for accelerators nobody could enumerate
    return {"spec": spec, "status": reading.status().wire()}


def _endpoint_cells(e: Endpoint) -> list[str]:
    link = "" if e.link is None else e.link.state.value
    rdma = e.rdma_device or "-"
    if e.rdma_software:
        rdma += " (software)"
    return [
        e.bus or ("virtual" if e.virtual else "-"),
        e.pci_bus_id or "-",
        f"{e.pci_vendor}:{e.pci_device}" if e.pci_vendor else "-",
        e.numa_affinity or "-",
        "-" if e.mtu is None else str(e.mtu),
        "yes" if e.up else "no",
        rdma,
        link or "-",
        f"{e.sriov_num_vfs}" if e.sriov else "-",
    ]


def links_summary(acc: Accelerator) -> str:
    """How many peers each kind of link reaches (`link:peers`), fastest first: "NV18:7", or
    "PIX:1,NODE:2,SYS:4" on a PCIe board."""
    counts = Counter(acc.topology.links.values())
    from nodefabric_devicemanager.pick import link_rank  # here: only the table needs it

    ordered = sorted(counts, key=lambda name: (-link_rank(name), name))
    return ",".join(f"{name}:{counts[name]}" for name in ordered) or "-"


def _accelerator_rows(reading: inventory.Reading) -> list[list[str]]:
    rows = [["ACCELERATOR", "INDEX", "PCI", "NUMA", "LINKS", "FABRIC"]]
    for group in reading.groups:
        for acc in group.accelerators:
            rows.append(
                [
                    group.id,
                    str(acc.index),
                    acc.topology.pci_bus_id or "-",
                    acc.topology.numa_affinity or "-",
                    links_summary(acc),
                    summary.fabric_domain(acc.topology.fabric) or "-",
                ]
            )
    return rows


def conditions_text(conditions: list[Condition], out: TextIO) -> None:
    """Every condition that is not True, one line each, as a table prints them."""
    for c in conditions:
        if c.status != "True":
            out.write(output.escape(f"{c.type}={c.status} {c.reason}: {c.message}") + "\n")


def table(reading: inventory.Reading, out: TextIO) -> None:
    rows = [["NAME", "BUS", "PCI", "ID", "NUMA", "MTU", "UP", "RDMA", "LINK", "VFS"]]
    for iface in reading.interfaces or []:
        rows.append([iface.name, *_endpoint_cells(iface)])
        rows.extend(
            [f"  └ {vf.name or '(no netdev)'}", *_endpoint_cells(vf)] for vf in iface.virtual_functions
        )
    if reading.interfaces is None:
        out.write("interfaces: not read (see InterfacesEnumerated below)\n")
    else:
        output.table(rows, out)
    accelerators = _accelerator_rows(reading)
    if len(accelerators) > 1:
        out.write("\n")
        output.table(accelerators, out)
    conditions_text(reading.conditions, out)


def run(args: argparse.Namespace) -> int:
    if refused_root("nodefabric inventory", args.root, args.driver_root):
        return 2
    reading = read(args)
    if args.output == "table":
        table(reading, sys.stdout)
    else:
        output.document(document(reading), args.output, sys.stdout, plain=True)
    return 1 if failed(reading) else 0
