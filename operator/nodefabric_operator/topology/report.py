"""What users read about the checked hierarchy: the FabricTopology object, its CRD, and the Events.

One cluster-scoped `FabricTopology` (placement.gpustack.ai/v1alpha1) named `nodefabric`: every level with
its label key, state and reason, which levels the projections carry, and one condition per violation
(`kubectl get fabrictopology`, `kubectl describe fabrictopology nodefabric`). Pure functions; the shell
writes them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from nodefabric_devicemanager import crd as _crd
from nodefabric_devicemanager import vocabulary
from nodefabric_operator import events
from nodefabric_operator.topology import project
from nodefabric_operator.topology.nesting import Hierarchy, Violation

GROUP = vocabulary.PLACEMENT_GROUP
VERSION = vocabulary.VERSION
PLURAL = vocabulary.FABRIC_TOPOLOGY_PLURAL
KIND = vocabulary.FABRIC_TOPOLOGY_KIND
API_VERSION = f"{GROUP}/{VERSION}"
CRD_NAME = f"{PLURAL}.{GROUP}"
CRD_FILE = f"{GROUP}_{PLURAL}.yaml"
NAME = "nodefabric"

MAX_CONDITIONS = 32  # one per violation beyond the summary; the rest are counted in the summary
MAX_EVENTS = 10  # violation Events per pass; a flood of them says no more than the object does

NESTED = "Nested"
NOT_NESTED = "LevelNotNested"
NESTED_AGAIN = "LevelNestedAgain"
REPLACED = "TopologyReplaced"
REPLACE_PENDING = "TopologyReplacePending"
WRITE_FAILED = "TopologyWriteFailed"
REMOVED = "TopologyRemoved"
VERSION_UNSUPPORTED = "TopologyVersionUnsupported"


def camel(name: str) -> str:
    """`network-group` -> `NetworkGroup`: a condition reason must be CamelCase."""
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[^A-Za-z0-9]+", name) if part)


def conditions(
    hierarchy: Hierarchy, now: str, previous: Sequence[Mapping[str, Any]] = ()
) -> list[dict[str, Any]]:
    """The summary condition `Nested` and one `NestingViolation` per violation (the first MAX_CONDITIONS).
    A condition that reads as before keeps its lastTransitionTime, so an unchanged hierarchy writes
    nothing."""
    shown = hierarchy.violations[:MAX_CONDITIONS]
    if hierarchy.violations:
        levels = sorted({v.level for v in hierarchy.violations})
        summary = {
            "type": NESTED,
            "status": "False",
            "reason": "LevelsLeftOut",
            "message": f"{len(hierarchy.violations)} violations; left out of every projection: "
            + ", ".join(levels),
        }
    else:
        summary = {
            "type": NESTED,
            "status": "True",
            "reason": "AllLevelsNest",
            "message": "projected: " + (", ".join(lv.name for lv in hierarchy.projected) or "hostname only"),
        }
    wanted = [summary, *(_violation_condition(v) for v in shown)]
    before = {_identity(c): c.get("lastTransitionTime") for c in previous if isinstance(c, Mapping)}
    return [{**c, "lastTransitionTime": before.get(_identity(c)) or now} for c in wanted]


def _identity(c: Mapping[str, Any]) -> tuple[Any, ...]:
    return (c.get("type"), c.get("status"), c.get("reason"), c.get("message"))


def _violation_condition(v: Violation) -> dict[str, Any]:
    return {
        "type": "NestingViolation",
        "status": "True",
        "reason": f"{camel(v.level)}Spans{camel(v.against)}",
        "message": v.message(),
    }


def status(
    hierarchy: Hierarchy,
    targets: Mapping[str, str],
    now: str,
    previous: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The object's status: `targets` says per target what was written or why not."""
    return {
        "nodes": hierarchy.nodes,
        "projected": ",".join(lv.name for lv in hierarchy.projected),
        "violations": len(hierarchy.violations),
        "levels": [
            {
                "name": lv.name,
                "key": lv.key or "",
                "state": lv.state,
                "nodes": lv.nodes,
                "values": lv.values,
                "reason": lv.reason(),
            }
            for lv in hierarchy.levels
        ],
        "targets": [{"name": t, "state": s} for t, s in sorted(targets.items())],
        "conditions": conditions(hierarchy, now, previous),
    }


def body(status_: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": NAME, "labels": project.managed_labels()},
        "status": dict(status_),
    }


def same_report(live: Mapping[str, Any] | None, status_: Mapping[str, Any]) -> bool:
    return live is not None and live.get("status") == status_


def notices(before: Hierarchy | None, after: Hierarchy) -> list[events.Notice]:
    """Events for violations that appeared (Warning, naming the level, value and a few nodes) and levels
    that nest again (Normal). Nothing for an unchanged hierarchy; after a start (`before` None) every
    standing violation is said once."""
    old = {(v.level, v.value, v.against) for v in (before.violations if before else ())}
    new_ones = [v for v in after.violations if (v.level, v.value, v.against) not in old]
    out = [events.Notice(events.WARNING, NOT_NESTED, v.message()[: events.MAX_MESSAGE]) for v in new_ones]
    if len(out) > MAX_EVENTS:
        rest = len(out) - MAX_EVENTS + 1
        out = [
            *out[: MAX_EVENTS - 1],
            events.Notice(events.WARNING, NOT_NESTED, f"{rest} more violations: see fabrictopology {NAME}"),
        ]
    if before is not None:
        was = {lv.name for lv in before.levels if lv.violations}
        for lv in after.levels:
            if lv.name in was and not lv.violations:
                out.append(
                    events.Notice(events.NORMAL, NESTED_AGAIN, f"{lv.title} nests again: {lv.reason()}")
                )
    return out


def crd() -> dict[str, Any]:
    """The FabricTopology CRD. Status is written whole by the operator (no status subresource: the object
    has no spec, and one write keeps it current)."""
    string = {"type": "string"}
    integer = {"type": "integer"}
    level = {
        "type": "object",
        "properties": {
            "name": string,
            "key": string,
            "state": {"type": "string", "enum": ["projected", "absent", "violating"]},
            "nodes": integer,
            "values": integer,
            "reason": string,
        },
    }
    condition = {
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            "type": string,
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "reason": string,
            "message": string,
            "lastTransitionTime": {"type": "string", "format": "date-time"},
        },
    }
    columns = [
        {"name": "Projected", "type": "string", "jsonPath": ".status.projected"},
        {"name": "Violations", "type": "integer", "jsonPath": ".status.violations"},
        {"name": "Nodes", "type": "integer", "jsonPath": ".status.nodes"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return _crd.definition(
        group=GROUP,
        version=VERSION,
        kind=KIND,
        plural=PLURAL,
        singular="fabrictopology",
        scope="Cluster",
        short_names=["ftopo"],
        description="nodefabric's checked locality hierarchy and the levels it projects into "
        "Kueue, KAI and Volcano topologies",
        properties={
            "apiVersion": string,
            "kind": string,
            "metadata": {"type": "object"},
            "status": {
                "type": "object",
                "properties": {
                    "nodes": integer,
                    "projected": string,
                    "violations": integer,
                    "levels": {"type": "array", "items": level},
                    "targets": {
                        "type": "array",
                        "items": {"type": "object", "properties": {"name": string, "state": string}},
                    },
                    "conditions": {"type": "array", "items": condition},
                },
            },
        },
        columns=columns,
        status_subresource=False,
        columns_last=True,
    )


def render_crd() -> str:
    return _crd.dump(crd(), "nodefabric_operator.topology.report")
