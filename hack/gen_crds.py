"""Regenerate the CRDs (Devices, PlacementGroup, FabricTopology) from the pydantic models into crds/ and
the chart's crds/."""

from __future__ import annotations

import pathlib

from nodefabric_devicemanager import crd
from nodefabric_operator.admission import model
from nodefabric_operator.topology import report

ROOT = pathlib.Path(__file__).resolve().parent.parent
RENDERS = {crd.CRD_FILE: crd.render, model.CRD_FILE: model.render, report.CRD_FILE: report.render_crd}

if __name__ == "__main__":
    for name, render in RENDERS.items():
        text = render()
        for target in (ROOT / "crds" / name, ROOT / "charts" / "nodefabric" / "crds" / name):
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            print(f"wrote {target.relative_to(ROOT)}")
