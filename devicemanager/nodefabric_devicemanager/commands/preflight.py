"""`nodefabric preflight`: the same pass as the agent, one verdict row per RDMA endpoint and a summary.

Exit 0 unless the pass itself failed: a broken link is a finding to print, not a failure to run.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any, TextIO

from nodefabric_devicemanager import inventory, summary
from nodefabric_devicemanager.commands import inventory as inventory_command
from nodefabric_devicemanager.commands import output
from nodefabric_devicemanager.models import Endpoint, LinkState


def add_arguments(parser: argparse.ArgumentParser) -> None:
    inventory_command.add_root(parser)
    output.add_output(parser, default="table")


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    pci_bus_id: str
    rdma_device: str
    verdict: str
    reason: str
    software: bool = False  # a software RDMA device (rxe, siw): listed, never counted as capable


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
        verdict, reason = LinkState.UNVERIFIED.value, "no link reading"
    else:
        verdict, reason = e.link.state.value, e.link.reason
    return Row(name, e.pci_bus_id, e.rdma_device, verdict, reason, e.rdma_software)


def _counts(found: list[Row]) -> dict[str, int]:
    return {s.value: sum(1 for r in found if r.verdict == s.value) for s in LinkState}


def summary_line(found: list[Row], capable: bool) -> str:
    verdict = "rdma capable" if capable else "not rdma capable"
    parts = ", ".join(f"{n} {s}" for s, n in _counts(found).items())
    software = sum(1 for r in found if r.software)
    note = f" ({software} software, not counted)" if software else ""
    return f"{len(found)} rdma endpoints{note}: {parts}; node is {verdict}"


def capable(reading: inventory.Reading) -> bool:
    # The same rule the operator's rdma.capable label follows, not a recount of the rows.
    return bool(summary.usable_endpoints(reading.spec()))


def print_report(reading: inventory.Reading, out: TextIO) -> None:
    found = rows(reading)
    table = [["NAME", "PCI", "RDMA", "VERDICT", "REASON"]]
    table += [
        [
            r.name,
            r.pci_bus_id or "-",
            f"{r.rdma_device or '-'}{' (software)' if r.software else ''}",
            r.verdict,
            r.reason,
        ]
        for r in found
    ]
    output.table(table, out)
    inventory_command.conditions_text(reading.conditions, out)
    if inventory_command.failed(reading):
        out.write("the pass failed: a part of the host could not be enumerated\n")
    if reading.interfaces is not None:
        out.write(summary_line(found, capable(reading)) + "\n")


def document(reading: inventory.Reading) -> dict[str, Any]:
    """The report as data: every row, the counts, the node's verdict (absent when the pass failed)."""
    found = rows(reading)
    doc: dict[str, Any] = {
        "endpoints": [
            {
                "name": r.name,
                "pciBusId": r.pci_bus_id,
                "rdmaDevice": r.rdma_device,
                "software": r.software,
                "verdict": r.verdict,
                "reason": r.reason,
            }
            for r in found
        ],
        "counts": _counts(found),
        "conditions": [c.wire() for c in reading.conditions if c.status != "True"],
    }
    if reading.interfaces is not None:
        doc["rdmaCapable"] = capable(reading)
    return doc


def run(args: argparse.Namespace) -> int:
    if inventory_command.refused_root("nodefabric preflight", args.root, args.driver_root):
        return 2
    reading = inventory_command.read(args)
    if args.output == "table":
        print_report(reading, sys.stdout)
    else:
        output.document(document(reading), args.output, sys.stdout)
    return 1 if inventory_command.failed(reading) else 0
