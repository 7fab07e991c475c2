"""The PlacementGroup custom resource: the only place a group's placement state lives.

Written only by the placement process (its own service account); nothing a pod carries is read back as
state. `hack/gen_crds.py` renders the CRD from these models; a test fails when the committed YAML is
stale.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from nodefabric_devicemanager import crd as _crd
from nodefabric_devicemanager import vocabulary

GROUP = vocabulary.PLACEMENT_GROUP
VERSION = vocabulary.VERSION
API_VERSION = f"{GROUP}/{VERSION}"
KIND = vocabulary.PLACEMENT_GROUP_KIND
PLURAL = vocabulary.PLACEMENT_GROUP_PLURAL
SINGULAR = vocabulary.PLACEMENT_GROUP_SINGULAR
SHORT_NAMES = ["plg"]
CRD_NAME = f"{PLURAL}.{GROUP}"
CRD_FILE = f"{GROUP}_{PLURAL}.yaml"
MANAGED_BY = {"app.kubernetes.io/managed-by": "nodefabric"}
FAMILY_LABEL = vocabulary.PLACEMENT_GROUP_FAMILY_LABEL

Phase = Literal["Pending", "Waiting", "NeverFits", "Admitted", "Bound", "TimedOut"]
PHASES: tuple[str, ...] = ("Pending", "Waiting", "NeverFits", "Admitted", "Bound", "TimedOut")
ConditionType = Literal["Admitted", "AllBound", "TimedOut"]

# DNS-1123 subdomain: 253 characters; names are kept to 200 plus a hash so a long key stays readable.
_MAX_PLAIN = 200
_OUTSIDE = re.compile(r"[^a-z0-9.-]")


def object_name(key: str) -> str:
    """The PlacementGroup's name for the group key "<namespace>/<family>/<name>": `<family>-<name>`,
    lowercased, anything outside [a-z0-9.-] replaced by '-', trimmed to a DNS-1123 subdomain; when anything
    was changed (two keys could then meet) or it is longer than 200 characters, '-' and the first 10 hex
    of sha256(key) follow."""
    _, _, rest = key.partition("/")
    family, _, name = rest.partition("/")
    plain = f"{family}-{name}"
    lowered = _OUTSIDE.sub("-", plain.lower())
    # A subdomain's labels start and end alphanumeric: "a..b", "-a", "a-." are refused.
    cleaned = re.sub(r"\.{2,}", ".", lowered)
    cleaned = re.sub(r"-+\.|\.-+", ".", cleaned).strip(".-")
    changed = cleaned != plain or len(cleaned) > _MAX_PLAIN or not cleaned
    if not changed:
        return cleaned
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    head = cleaned[:_MAX_PLAIN].rstrip(".-")
    return f"{head}-{digest}" if head else digest


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class Member(_Model):
    """One pod of the group as the admission knows it."""

    pod: str
    uid: str = ""
    node: str = Field(
        "",
        description="The node it is assigned to; empty until the group is admitted, and kept while it is"
        " bound there when the group waits again for a replaced member.",
    )
    bound: bool = False
    ready: bool = False


class Condition(_Model):
    type: ConditionType
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: datetime | None = Field(None, alias="lastTransitionTime")


class PlacementGroupSpec(_Model):
    key: str = Field("", description='The group key "<namespace>/<family>/<name>".')
    family: str = Field("", description="How the pods name their group: job, jobset, kueue, explicit, ...")
    name: str = ""


class PlacementGroupStatus(_Model):
    size: int | None = Field(None, description="The expected number of pods; null while unknown.")
    size_source: str = Field("", alias="sizeSource", description="Where the size came from.")
    locality: str = ""
    rank: str = ""
    homogeneous_keys: list[str] = Field(default_factory=list, alias="homogeneousKeys")
    phase: Phase = "Pending"
    members: list[Member] = Field(default_factory=list, description="The group's pods, sorted by name.")
    level: str = ""
    location: str = ""
    homogeneity: dict[str, str] = Field(default_factory=dict)
    decision: str = Field("", description="The placement decision: placed, wait or never fits, and why.")
    admitted_time: datetime | None = Field(None, alias="admittedTime")
    attempts: int = Field(0, description="Admissions so far.")
    next_attempt_time: datetime | None = Field(None, alias="nextAttemptTime")
    conditions: list[Condition] = Field(default_factory=list)

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)


class PlacementGroup(_Model):
    api_version: str = Field(API_VERSION, alias="apiVersion")
    kind: str = KIND
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: PlacementGroupSpec = Field(default_factory=PlacementGroupSpec)
    status: PlacementGroupStatus = Field(default_factory=PlacementGroupStatus)


def set_condition(
    conditions: list[Condition],
    type_: ConditionType,
    *,
    status: Literal["True", "False", "Unknown"],
    reason: str,
    message: str,
    now: datetime,
) -> list[Condition]:
    """The conditions with one of them set; its transition time moves only when its status does."""
    old = next((c for c in conditions if c.type == type_), None)
    since = old.last_transition_time if old is not None and old.status == status else now
    new = Condition(type=type_, status=status, reason=reason, message=message, lastTransitionTime=since)
    rest = [c for c in conditions if c.type != type_]
    order = {"Admitted": 0, "AllBound": 1, "TimedOut": 2}
    return sorted([*rest, new], key=lambda c: order[c.type])


PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Size", "type": "integer", "jsonPath": ".status.size", "description": "Expected pods"},
    {
        "name": "Admitted",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Admitted")].status',
        "description": "The whole group was given nodes",
    },
    {
        "name": "Bound",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="AllBound")].status',
        "description": "Every member is bound and Ready",
    },
    {"name": "Level", "type": "string", "jsonPath": ".status.level"},
    {"name": "Location", "type": "string", "jsonPath": ".status.location"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _status_schema() -> dict[str, Any]:
    status = _crd.schema_of(PlacementGroupStatus)
    status["properties"]["conditions"].update(
        {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}
    )
    return status


def placement_crd() -> dict[str, Any]:
    return _crd.definition(
        group=GROUP,
        version=VERSION,
        kind=KIND,
        plural=PLURAL,
        singular=SINGULAR,
        scope="Namespaced",
        short_names=SHORT_NAMES,
        categories=["nodefabric"],
        description="One distributed group's admission: its expected size, members, the location it was "
        "given and each member's node. Written only by nodefabric.",
        properties={
            "apiVersion": {"type": "string", "description": API_VERSION},
            "kind": {"type": "string", "description": KIND},
            "metadata": {"type": "object"},
            "spec": _crd.schema_of(PlacementGroupSpec),
            "status": _status_schema(),
        },
        columns=PRINTER_COLUMNS,
        status_subresource=True,
    )


def render() -> str:
    return _crd.dump(placement_crd(), "nodefabric_operator.admission.model")
