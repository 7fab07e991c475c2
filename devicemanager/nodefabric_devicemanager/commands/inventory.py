"""`nodefabric inventory`: read this host and print the Devices record it would publish."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

import yaml

from nodefabric_devicemanager import inventory
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import Endpoint


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", default="/", help="host root to read /sys from (default: /)")
    parser.add_argument("--output", "-o", choices=["json", "yaml", "table"], default="json")


def document(reading: inventory.Reading) -> dict[str, Any]:
    spec = reading.spec().wire()
    if reading.interfaces is None:
        # Not read is not empty: leave the key out so nobody reads "this host has no interfaces".
        del spec["interfaces"]
    return {"spec": spec, "status": reading.status().wire()}


def _cell(e: Endpoint) -> list[str]:
    link = "" if e.link is None else e.link.state.value
    return [
        e.bus or ("virtual" if e.virtual else "-"),
        e.pci_bus_id or "-",
        f"{e.pci_vendor}:{e.pci_device}" if e.pci_vendor else "-",
        e.numa_affinity or "-",
        str(e.mtu),
        "yes" if e.up else "no",
        e.rdma_device or "-",
        link or "-",
        f"{e.sriov_num_vfs}" if e.sriov else "-",
    ]


def table(reading: inventory.Reading, out: TextIO) -> None:
    rows = [["NAME", "BUS", "PCI", "ID", "NUMA", "MTU", "UP", "RDMA", "LINK", "VFS"]]
    for iface in reading.interfaces or []:
        rows.append([iface.name, *_cell(iface)])
        rows.extend([f"  └ {vf.name or '(no netdev)'}", *_cell(vf)] for vf in iface.virtual_functions)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n")
    for c in reading.conditions:
        if c.status != "True":
            out.write(f"{c.type}={c.status} {c.reason}: {c.message}\n")


def run(args: argparse.Namespace) -> int:
    reading = inventory.read(HostRoot.at(args.root))
    if args.output == "table":
        table(reading, sys.stdout)
    elif args.output == "yaml":
        yaml.safe_dump(document(reading), sys.stdout, sort_keys=False)
    else:
        json.dump(document(reading), sys.stdout, indent=2)
        sys.stdout.write("\n")
    return 0 if reading.interfaces is not None else 1
