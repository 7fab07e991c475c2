"""The Devices CustomResourceDefinition, generated from the pydantic models so the two cannot drift.

`hack/gen_crds.py` writes it to `crds/` and the chart; a test fails when the committed YAML is stale.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml
from pydantic import BaseModel

from nodefabric_devicemanager import models

CRD_FILE = f"{models.GROUP}_{models.PLURAL}.yaml"
# `kubectl get device` / `kubectl get dev`: the kind is plural-looking, so its singular is "devices".
SHORT_NAMES = ["device", "dev"]

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {
        # What kubelet's RDMA keys draw on, so it matches allocatable: a PF with VFs configured is not
        # counted (its VFs are). `rdmaEndpoints`, what rdma.capable counts, is the -o wide USABLE column.
        "name": "RDMA",
        "type": "integer",
        "jsonPath": ".status.rdmaServed",
        "description": "RDMA endpoints the device plugin serves: whole functions without VFs, and VFs",
    },
    {
        "name": "Distance",
        "type": "string",
        "jsonPath": ".status.bestDistance",
        "description": "Closest accelerator-to-usable-RDMA-endpoint distance (SELF..SYS, UNK)",
    },
    {
        "name": "Fabric",
        "type": "string",
        "jsonPath": ".status.fabricDomain",
        "description": "Scale-up fabric domain shared by every accelerator, if any",
    },
    {
        "name": "Failed",
        "type": "integer",
        "jsonPath": ".status.failedLinks",
        "description": "Endpoints whose RDMA link verdict is Failed",
    },
    {
        "name": "Unread",
        "type": "string",
        "jsonPath": ".status.notRead",
        "description": "Parts of the host the last pass could not read (the recorded data is kept)",
    },
    {
        "name": "Usable",
        "type": "integer",
        "priority": 1,
        "jsonPath": ".status.rdmaEndpoints",
        "description": "Usable RDMA endpoints, what rdma.capable counts (a PF with VFs and its VFs each)",
    },
    {
        "name": "Interfaces",
        "type": "string",
        "priority": 1,
        "jsonPath": ".spec.interfaces[*].name",
        "description": "Kernel network interfaces",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    """pydantic's JSON schema -> a Kubernetes structural schema: refs inlined, Optional as nullable,
    no titles or defaults (the API server would apply defaults the agent never sent and so make every
    comparison with the live object differ)."""
    if isinstance(node, list):
        return [_structural(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs)
    any_of = node.get("anyOf")
    if any_of is not None:
        non_null = [s for s in any_of if s.get("type") != "null"]
        if len(non_null) == 1 and len(any_of) == 2:
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            optional: dict[str, Any] = _structural({**non_null[0], **rest}, defs)
            optional["nullable"] = True
            return optional
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("title", "default", "$defs"):
            continue
        if key == "const":
            out["enum"] = [value]
            continue
        if key == "description" and isinstance(value, str):
            # Docstrings wrap at the source's line length; `kubectl explain` wraps on its own.
            out[key] = " ".join(value.split())
            continue
        if key == "properties":
            out[key] = {k: _structural(v, defs) for k, v in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _structural(value, defs)
        else:
            out[key] = value
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return out


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    """A pydantic model's serialization schema as a CRD's structural schema (other CRDs use it too)."""
    raw = model.model_json_schema(by_alias=True, mode="serialization")
    result: dict[str, Any] = _structural(raw, raw.get("$defs", {}))
    result.pop("required", None)  # every field of spec and status has a meaning when absent
    return result


def _status_schema() -> dict[str, Any]:
    status = schema_of(models.DevicesStatus)
    # One condition per type, merged by the API server as a map: two writers (agent, operator) each own
    # their types, and a duplicate type is refused rather than stored twice.
    status["properties"]["conditions"].update(
        {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}
    )
    return status


def definition(
    *,
    group: str,
    version: str,
    kind: str,
    plural: str,
    singular: str,
    scope: str,
    short_names: Sequence[str],
    categories: Sequence[str] = (),
    description: str,
    properties: Mapping[str, Any],
    columns: Sequence[Mapping[str, Any]],
    status_subresource: bool,
    columns_last: bool = False,
) -> dict[str, Any]:
    """One CustomResourceDefinition of one served and stored version, from its parts. `columns_last` puts
    the printer columns after the schema: the order FabricTopology's committed YAML has always had."""
    names: dict[str, Any] = {
        "plural": plural,
        "singular": singular,
        "kind": kind,
        "listKind": f"{kind}List",
        "shortNames": list(short_names),
    }
    if categories:
        names["categories"] = list(categories)
    served: dict[str, Any] = {"name": version, "served": True, "storage": True}
    if status_subresource:
        served["subresources"] = {"status": {}}
    printed = {"additionalPrinterColumns": [dict(c) for c in columns]}
    schema = {
        "schema": {
            "openAPIV3Schema": {"type": "object", "description": description, "properties": dict(properties)}
        }
    }
    served |= (schema | printed) if columns_last else (printed | schema)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {"group": group, "scope": scope, "names": names, "versions": [served]},
    }


def devices_crd() -> dict[str, Any]:
    return definition(
        group=models.GROUP,
        version=models.VERSION,
        kind=models.KIND,
        plural=models.PLURAL,
        singular=models.SINGULAR,
        scope="Cluster",
        short_names=SHORT_NAMES,
        categories=["nodefabric"],
        description="How one node is wired: network interfaces, RDMA endpoints and their link state, "
        "accelerators and their scale-up fabric. Named after the node.",
        properties={
            "apiVersion": {
                "type": "string",
                "description": models.API_VERSION,
            },
            "kind": {"type": "string", "description": models.KIND},
            "metadata": {
                "type": "object",
                "description": "Named after the node, and owned by it.",
            },
            "spec": schema_of(models.DevicesSpec),
            "status": _status_schema(),
        },
        columns=PRINTER_COLUMNS,
        status_subresource=True,
    )


class _NoAliases(yaml.SafeDumper):
    """Shared sub-schemas are written out in full: anchors are legal YAML but unreadable in a CRD."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump(crd: dict[str, Any], source: str) -> str:
    """A CRD as the committed YAML: a header naming its source, no anchors, fields in schema order."""
    header = f"# Generated from {source} by hack/gen_crds.py. Do not edit.\n"
    return header + yaml.dump(crd, Dumper=_NoAliases, sort_keys=False, width=110)


def render() -> str:
    return dump(devices_crd(), "nodefabric_devicemanager.models")
