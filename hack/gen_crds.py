"""Regenerate the Devices CRD from the pydantic models, and the FabricTopology CRD, into crds/ and the
chart's crds/."""

from __future__ import annotations

import pathlib

from nodefabric_devicemanager import crd

ROOT = pathlib.Path(__file__).resolve().parent.parent
TARGETS = [ROOT / "crds" / crd.CRD_FILE, ROOT / "charts" / "nodefabric" / "crds" / crd.CRD_FILE]


def fabric_topology() -> None:
    """The FabricTopology CRD the operator's --topology report is written to (issue 21)."""
    from nodefabric_operator.topology import report

    text = report.render_crd()
    for target in (
        ROOT / "crds" / report.CRD_FILE,
        ROOT / "charts" / "nodefabric" / "crds" / report.CRD_FILE,
    ):
        target.write_text(text)
        print(f"wrote {target.relative_to(ROOT)}")


if __name__ == "__main__":
    text = crd.render()
    for target in TARGETS:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        print(f"wrote {target.relative_to(ROOT)}")
    fabric_topology()
