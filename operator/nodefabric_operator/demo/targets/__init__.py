"""The schema facts of the schedulers nodefabric projects its topology into: Kueue's and KAI's Topology,
Volcano's HyperNode. Each file is the target's published CRD cut to what nodefabric writes (its
openAPIV3Schema and x-kubernetes-validations), so the embedded API can serve them to the demo and the
tests, and the tests can apply their CEL rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
KUEUE = "kueue.yaml"  # v1beta2 and v1beta1 served
KUEUE_V1BETA1_ONLY = "kueue-v1beta1-only.yaml"
KAI = "kai.yaml"
VOLCANO = "volcano.yaml"


def load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((HERE / name).read_text())
    return doc
