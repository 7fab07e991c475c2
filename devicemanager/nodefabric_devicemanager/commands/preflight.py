"""`nodefabric preflight`: the same pass as the agent, one verdict row per RDMA endpoint and a summary.

Exit 0 unless the pass itself failed: a broken link is a finding to print, not a failure to run.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import TextIO

from nodefabric_devicemanager import inventory, summary
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import Endpoint, LinkState


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", default="/", help="host root to read /sys from (default: /)")


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    pci_bus_id: str
    rdma_device: str
    verdict: str
    reason: str


def rows(reading: inventory.Reading) -> list[Row]:
    """One row per RDMA endpoint: bound to a device, or carrying a verdict (an unreadable tree)."""
    out: list[Row] = []
    for iface in reading.interfaces or []:
        for e in (iface, *iface.virtual_functions):
            if e.rdma or e.link is not None:
                out.append(_row(e, iface.name))
    return out


def _row(e: Endpoint, parent: str) -> Row:
    name = e.name or f"{parent} vf"
    if e.link is None:
        # Bound device with no verdict cannot happen from one pass; say so rather than claim ok.
        return Row(name, e.pci_bus_id, e.rdma_device, LinkState.UNVERIFIED.value, "no link reading")
    return Row(name, e.pci_bus_id, e.rdma_device, e.link.state.value, e.link.reason)


def summary_line(found: list[Row], capable: bool) -> str:
    counts = {s.value: sum(1 for r in found if r.verdict == s.value) for s in LinkState}
    verdict = "rdma capable" if capable else "not rdma capable"
    parts = ", ".join(f"{n} {s}" for s, n in counts.items())
    return f"{len(found)} rdma endpoints: {parts}; node is {verdict}"


def print_report(reading: inventory.Reading, out: TextIO) -> None:
    found = rows(reading)
    table = [["NAME", "PCI", "RDMA", "VERDICT", "REASON"]]
    table += [[r.name, r.pci_bus_id or "-", r.rdma_device or "-", r.verdict, r.reason] for r in found]
    widths = [max(len(t[i]) for t in table) for i in range(4)]
    for t in table:
        out.write(
            "  ".join([*(c.ljust(w) for c, w in zip(t[:4], widths, strict=True)), t[4]]).rstrip() + "\n"
        )
    for c in reading.conditions:
        if c.status != "True":
            out.write(f"{c.type}={c.status} {c.reason}: {c.message}\n")
    if reading.interfaces is None:
        out.write("the pass failed: interfaces could not be enumerated\n")
    else:
        # The same rule the operator's rdma.capable label follows, not a recount of the rows.
        capable = bool(summary.usable_endpoints(reading.spec()))
        out.write(summary_line(found, capable) + "\n")


def run(args: argparse.Namespace) -> int:
    reading = inventory.read(HostRoot.at(args.root))
    print_report(reading, sys.stdout)
    return 0 if reading.interfaces is not None else 1
