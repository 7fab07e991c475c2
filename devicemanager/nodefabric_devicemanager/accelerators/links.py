"""Per-accelerator links to every peer of its group: a direct fabric link where the vendor reports one
(NV<n>, LINK), else the bus-coordinate distance (PIX ... SYS, UNK) the interfaces use too."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from nodefabric_devicemanager import distance, numbers
from nodefabric_devicemanager.models import AcceleratorGroup
from nodefabric_devicemanager.pci import PciFunction

# (a, b) -> the fabric link's name ("NV18", "LINK"), or None when the two share no direct fabric link
FabricLink = Callable[[PciFunction, PciFunction], str | None]


def build(functions: Sequence[PciFunction], fabric_link: FabricLink | None = None) -> list[dict[str, str]]:
    """One links map per function, keyed by peer index (position in `functions`) as a string."""
    coords = [distance.of(fn) for fn in functions]
    out: list[dict[str, str]] = [{} for _ in functions]
    for i, a in enumerate(functions):
        for j in range(i + 1, len(functions)):
            b = functions[j]
            name = fabric_link(a, b) if fabric_link is not None else None
            if name is None:
                name = distance.distance(coords[i], coords[j]).name
            out[i][str(j)] = name
            out[j][str(i)] = name
    return out


def group_matrix(group: AcceleratorGroup) -> dict[int, dict[int, str]]:
    """The group's links as the pick function reads them: index -> peer index -> link."""
    matrix: dict[int, dict[int, str]] = {}
    for acc in group.accelerators:
        row: dict[int, str] = {}
        for peer, link in acc.topology.links.items():
            # Read back from a record: a key that is not a plain index is no peer (numbers.py's rule).
            index = numbers.parse_opt(peer, numbers.DEVICE_INDEX)
            if index is not None:
                row[index] = link
        matrix[acc.index] = row
    return matrix
