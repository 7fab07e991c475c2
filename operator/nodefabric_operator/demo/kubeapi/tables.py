"""Server-side printing: the `meta.k8s.io/v1` Table kubectl asks for (`Accept: ...;as=Table`).

kubectl prints what the server renders: a custom resource's `additionalPrinterColumns`, and for
built-in kinds the columns the API server's own printers produce (a Node's STATUS, ROLES, VERSION),
with ages as `duration.HumanDuration` writes them.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Cell = Callable[[Mapping[str, Any]], Any]


@dataclass(frozen=True)
class Column:
    name: str
    cell: Cell
    type: str = "string"
    priority: int = 0
    description: str = ""
    format: str = ""

    def definition(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        }


_SEGMENT = re.compile(
    r"""\.(?P<name>[^.\[]+)|\[(?P<index>\*|-?\d+)\]|\[\?\(@\.(?P<field>[^=!)]+?)\s*(?P<op>==|!=)\s*(?P<quote>["'])(?P<value>.*?)(?P=quote)\)\]"""
)


def jsonpath(obj: Any, path: str) -> list[Any]:
    """The JSONPath subset printer columns use: `.a.b`, `.a[*].b`, `.a[0]`, and filters
    `.a[?(@.type=="Ready")].status` (CRDs' condition columns)."""
    values = [obj]
    text = path.strip()
    if not text.startswith("."):
        text = "." + text
    pos = 0
    while pos < len(text):
        m = _SEGMENT.match(text, pos)
        if m is None:
            return []  # not a path this subset reads: no value, as kubectl shows <none>
        pos = m.end()
        if m.group("name") is not None:
            values = [v[m.group("name")] for v in values if isinstance(v, dict) and m.group("name") in v]
            continue
        items = [item for v in values if isinstance(v, list) for item in v]
        index = m.group("index")
        if index == "*":
            values = items
        elif index is not None:
            values = [
                item for v in values if isinstance(v, list) for item in v[int(index) : int(index) + 1 or None]
            ]
        else:
            keys = m.group("field").split(".")
            values = [
                item for item in items if (_get(item, keys) == m.group("value")) == (m.group("op") == "==")
            ]
    return values


def _get(value: Any, keys: list[str]) -> Any:
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def human_duration(seconds: float) -> str:
    """apimachinery's `duration.HumanDuration`, which the API server uses for every age column."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def age(timestamp: Any) -> str:
    if not isinstance(timestamp, str) or not timestamp:
        return "<unknown>"
    try:
        then = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return "<invalid>"
    if then.tzinfo is None:
        then = then.replace(tzinfo=datetime.UTC)
    return human_duration((datetime.datetime.now(datetime.UTC) - then).total_seconds())


def _path(obj: Mapping[str, Any], *keys: str) -> Any:
    value: Any = obj
    for key in keys:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def _or_none(value: Any) -> Any:
    return "<none>" if value in (None, "") else value


AGE = Column(
    "Age",
    lambda o: age(_path(o, "metadata", "creationTimestamp")),
    description="CreationTimestamp is a timestamp representing the server time when this object was created.",
)


def crd_columns(columns: Iterable[Mapping[str, Any]]) -> list[Column]:
    """A CRD's additionalPrinterColumns; `date` columns are printed as ages, as the API server does."""
    out = []
    for c in columns:

        def cell(obj: Mapping[str, Any], c: Mapping[str, Any] = c) -> Any:
            found = jsonpath(obj, c["jsonPath"])
            if not found:
                return None
            if c.get("type") == "date":
                return age(found[0])
            if len(found) == 1:
                return found[0]
            return ",".join(str(v) for v in found)

        out.append(
            Column(
                c["name"],
                cell,
                type=c.get("type", "string"),
                priority=c.get("priority", 0),
                description=c.get("description", ""),
                format=c.get("format", ""),
            )
        )
    return out


# --- the built-in printers -------------------------------------------------------------------------------


def _node_status(o: Mapping[str, Any]) -> str:
    ready = next((c for c in _path(o, "status", "conditions") or [] if c.get("type") == "Ready"), None)
    status = "Unknown" if ready is None else ("Ready" if ready.get("status") == "True" else "NotReady")
    return status + (",SchedulingDisabled" if _path(o, "spec", "unschedulable") else "")


def _node_roles(o: Mapping[str, Any]) -> str:
    labels = _path(o, "metadata", "labels") or {}
    roles = {k.partition("/")[2] for k in labels if k.startswith("node-role.kubernetes.io/")}
    if labels.get("kubernetes.io/role"):
        roles.add(labels["kubernetes.io/role"])
    return ",".join(sorted(r for r in roles if r)) or "<none>"


def _pod_ready(o: Mapping[str, Any]) -> str:
    statuses = _path(o, "status", "containerStatuses") or []
    containers = _path(o, "spec", "containers") or []
    return f"{sum(bool(s.get('ready')) for s in statuses)}/{len(containers)}"


def _pod_status(o: Mapping[str, Any]) -> str:
    if _path(o, "metadata", "deletionTimestamp"):
        return "Terminating"
    return str(_path(o, "status", "reason") or _path(o, "status", "phase") or "Pending")


def _claim_state(o: Mapping[str, Any]) -> str:
    if _path(o, "metadata", "deletionTimestamp"):
        return "deleted"
    states = ["allocated" if _path(o, "status", "allocation") else "pending"]
    if _path(o, "status", "reservedFor"):
        states.append("reserved")
    return ",".join(states)


def _event_object(o: Mapping[str, Any]) -> str:
    ref = o.get("involvedObject") or o.get("regarding") or {}
    return f"{str(ref.get('kind', '')).lower()}/{ref.get('name', '')}"


def _event_last_seen(o: Mapping[str, Any]) -> str:
    for key in ("lastTimestamp", "eventTime", "firstTimestamp"):
        if o.get(key):
            return age(o[key])
    return age(_path(o, "metadata", "creationTimestamp"))


BUILTIN_COLUMNS: dict[str, list[Column]] = {
    "v1/nodes": [
        Column("Status", _node_status),
        Column("Roles", _node_roles),
        AGE,
        Column("Version", lambda o: _path(o, "status", "nodeInfo", "kubeletVersion") or ""),
        Column("Internal-IP", lambda o: _node_address(o, "InternalIP"), priority=1),
        Column("External-IP", lambda o: _node_address(o, "ExternalIP"), priority=1),
    ],
    "v1/pods": [
        Column("Ready", _pod_ready),
        Column("Status", _pod_status),
        Column(
            "Restarts",
            lambda o: sum(s.get("restartCount", 0) for s in _path(o, "status", "containerStatuses") or []),
            type="integer",
        ),
        AGE,
        Column("IP", lambda o: _or_none(_path(o, "status", "podIP")), priority=1),
        Column("Node", lambda o: _or_none(_path(o, "spec", "nodeName")), priority=1),
    ],
    "v1/namespaces": [Column("Status", lambda o: _path(o, "status", "phase") or "Active"), AGE],
    "v1/events": [
        Column("Last Seen", _event_last_seen),
        Column("Type", lambda o: o.get("type", "")),
        Column("Reason", lambda o: o.get("reason", "")),
        Column("Object", _event_object),
        Column("Message", lambda o: o.get("message") or o.get("note") or ""),
    ],
    "coordination.k8s.io/v1/leases": [
        Column("Holder", lambda o: _path(o, "spec", "holderIdentity") or ""),
        AGE,
    ],
    "apiextensions.k8s.io/v1/customresourcedefinitions": [
        Column("Created At", lambda o: _path(o, "metadata", "creationTimestamp") or "", type="date")
    ],
    "resource.k8s.io/v1/resourceslices": [
        Column("Node", lambda o: _path(o, "spec", "nodeName") or ""),
        Column("Driver", lambda o: _path(o, "spec", "driver") or ""),
        Column("Pool", lambda o: _path(o, "spec", "pool", "name") or ""),
        AGE,
    ],
    "resource.k8s.io/v1/resourceclaims": [Column("State", _claim_state), AGE],
}
BUILTIN_COLUMNS["events.k8s.io/v1/events"] = BUILTIN_COLUMNS["v1/events"]


def _node_address(o: Mapping[str, Any], kind: str) -> str:
    for address in _path(o, "status", "addresses") or []:
        if address.get("type") == kind:
            return str(address.get("address", ""))
    return "<none>"


def render_table(
    items: Iterable[Mapping[str, Any]],
    columns: Iterable[Column],
    meta: Mapping[str, Any],
    *,
    include: str = "Metadata",
    definitions: bool = True,
) -> dict[str, Any]:
    """A Table of `items`; `include` is the request's includeObject (None, Metadata or Object)."""
    columns = list(columns)
    name = {"name": "Name", "type": "string", "format": "name", "priority": 0}
    name["description"] = "Name must be unique within a namespace."
    rows = []
    for item in items:
        row: dict[str, Any] = {"cells": [item["metadata"]["name"], *(c.cell(item) for c in columns)]}
        if include == "Object":
            row["object"] = item
        elif include != "None":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": item["metadata"],
            }
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": dict(meta),
        "columnDefinitions": [name, *(c.definition() for c in columns)] if definitions else None,
        "rows": rows,
    }


def as_table(
    items: list[dict[str, Any]], columns: list[dict[str, Any]], meta: dict[str, Any]
) -> dict[str, Any]:
    """A Table as the API server renders a custom resource's printer columns for kubectl."""
    return render_table(items, crd_columns(columns) if columns else [AGE], meta)
