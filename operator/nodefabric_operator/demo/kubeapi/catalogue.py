"""The resource types the API serves: built-in ones our parts touch, and those CRDs declare.

Each type carries what discovery, printing, selection and validation need: names (plural, singular,
short names, categories, as a CRD declares them), scope, subresources, the fields it can be selected
by, its printer columns and, for a custom resource, its structural schema.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kmock

from nodefabric_operator.demo.kubeapi.structural import Structural
from nodefabric_operator.demo.kubeapi.tables import AGE, BUILTIN_COLUMNS, Column, crd_columns

_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
_SUB_VERBS = {
    "status": ["get", "patch", "update"],
    "binding": ["create"],
    "eviction": ["create"],
    "finalize": ["update"],
}
_SUB_KINDS = {"binding": "Binding", "eviction": "Eviction"}

_EVENT_FIELDS = (
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
)


@dataclass
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    selectable: frozenset[str] = frozenset()
    columns: list[Column] = field(default_factory=lambda: [AGE])
    schema: Structural | None = None
    crd: str = ""  # the CRD that declared it, if any

    @classmethod
    def from_key(cls, key: str, kind: str, namespaced: bool, **more: Any) -> ResourceType:
        """A type named by its key, "group/version/plural" ("v1/nodes" for the core group)."""
        ref = kmock.resource(key)
        return cls(
            group=ref.group or "",
            version=ref.version or "",
            plural=ref.plural or "",
            kind=kind,
            namespaced=namespaced,
            **more,
        )

    def __post_init__(self) -> None:
        self.singular = self.singular or self.kind.lower()
        self.selectable = self.selectable | {"metadata.name", "metadata.namespace"}
        self.ref = kmock.resource(self.group, self.version, self.plural)

    @property
    def key(self) -> str:
        return f"{self.group_version}/{self.plural}"

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    def discovery(self) -> list[dict[str, Any]]:
        out = [
            {
                "name": self.plural,
                "singularName": self.singular,
                "namespaced": self.namespaced,
                "kind": self.kind,
                "verbs": _VERBS,
                **({"shortNames": list(self.short_names)} if self.short_names else {}),
                **({"categories": list(self.categories)} if self.categories else {}),
            }
        ]
        for sub in sorted(self.subresources):
            out.append(
                {
                    "name": f"{self.plural}/{sub}",
                    "singularName": "",
                    "namespaced": self.namespaced,
                    "kind": _SUB_KINDS.get(sub, self.kind),
                    "verbs": _SUB_VERBS.get(sub, ["get", "patch", "update"]),
                }
            )
        return out


def _builtin(
    key: str,
    kind: str,
    namespaced: bool,
    subresources: Iterable[str] = (),
    *,
    short: Iterable[str] = (),
    categories: Iterable[str] = (),
    fields: Iterable[str] = (),
) -> ResourceType:
    return ResourceType.from_key(
        key,
        kind,
        namespaced,
        short_names=tuple(short),
        categories=tuple(categories),
        subresources=frozenset(subresources),
        selectable=frozenset(fields),
        columns=BUILTIN_COLUMNS.get(key, [AGE]),
    )


def builtin_types() -> list[ResourceType]:
    """The built-in resources our parts and kubectl touch (NodeFeature and PodGroup stand for the CRDs
    that NFD and scheduler-plugins install, schema-less)."""
    return [
        _builtin("v1/nodes", "Node", False, ("status",), short=("no",), fields=("spec.unschedulable",)),
        _builtin(
            "v1/pods",
            "Pod",
            True,
            ("status", "binding", "eviction"),
            short=("po",),
            categories=("all",),
            fields=(
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "spec.hostNetwork",
                "status.phase",
                "status.podIP",
                "status.nominatedNodeName",
            ),
        ),
        _builtin(
            "v1/namespaces",
            "Namespace",
            False,
            ("status", "finalize"),
            short=("ns",),
            fields=("status.phase",),
        ),
        _builtin("v1/events", "Event", True, short=("ev",), fields=_EVENT_FIELDS),
        _builtin(
            "events.k8s.io/v1/events",
            "Event",
            True,
            short=("ev",),
            fields=(
                "reason",
                "type",
                "reportingController",
                "regarding.kind",
                "regarding.name",
                "regarding.namespace",
                "regarding.uid",
            ),
        ),
        _builtin("coordination.k8s.io/v1/leases", "Lease", True),
        _builtin(
            "admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
            "MutatingWebhookConfiguration",
            False,
        ),
        _builtin(
            "apiextensions.k8s.io/v1/customresourcedefinitions",
            "CustomResourceDefinition",
            False,
            ("status",),
            short=("crd", "crds"),
        ),
        _builtin("nfd.k8s-sigs.io/v1alpha1/nodefeatures", "NodeFeature", True),
        _builtin("scheduling.x-k8s.io/v1alpha1/podgroups", "PodGroup", True, ("status",)),
        _builtin(
            "resource.k8s.io/v1/resourceslices",
            "ResourceSlice",
            False,
            fields=("spec.nodeName", "spec.driver", "spec.pool.name"),
        ),
        _builtin("resource.k8s.io/v1/resourceclaims", "ResourceClaim", True, ("status",)),
        _builtin("resource.k8s.io/v1/deviceclasses", "DeviceClass", False),
    ]


def crd_types(crd: Mapping[str, Any]) -> list[ResourceType]:
    """One resource type per served version of a CustomResourceDefinition."""
    spec = crd["spec"]
    names = spec["names"]
    out = []
    for version in spec.get("versions", []):
        if not version.get("served", True):
            continue
        columns = version.get("additionalPrinterColumns")
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        out.append(
            ResourceType(
                group=spec["group"],
                version=version["name"],
                plural=names["plural"],
                kind=names["kind"],
                namespaced=spec.get("scope") == "Namespaced",
                singular=names.get("singular", ""),
                short_names=tuple(names.get("shortNames", ())),
                categories=tuple(names.get("categories", ())),
                subresources=frozenset((version.get("subresources") or {}).keys()),
                selectable=frozenset(
                    f.get("jsonPath", "").lstrip(".") for f in version.get("selectableFields", [])
                ),
                columns=crd_columns(columns) if columns else [AGE],
                schema=Structural(schema) if schema else None,
                crd=crd.get("metadata", {}).get("name", ""),
            )
        )
    return out


_VERSION_RE = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


def version_priority(version: str) -> tuple[int, int, int, str]:
    """Kubernetes' version order: GA before beta before alpha, higher numbers first; others last."""
    m = _VERSION_RE.fullmatch(version)
    if not m:
        return (3, 0, 0, version)
    stage = {None: 0, "beta": 1, "alpha": 2}[m.group(2)]
    return (stage, -int(m.group(1)), -int(m.group(3) or 0), version)


class Catalogue:
    def __init__(self) -> None:
        self._types: dict[tuple[str, str, str], ResourceType] = {}

    def add(self, rt: ResourceType) -> None:
        self._types[rt.group, rt.version, rt.plural] = rt

    def remove_crd(self, name: str) -> list[ResourceType]:
        gone = [rt for rt in self._types.values() if rt.crd == name]
        for rt in gone:
            del self._types[rt.group, rt.version, rt.plural]
        return gone

    def get(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._types.get((group, version, plural))

    def by_key(self, key: str) -> ResourceType | None:
        ref = kmock.resource(key)
        return self.get(ref.group or "", ref.version or "", ref.plural or "")

    def __iter__(self) -> Any:
        return iter(list(self._types.values()))

    # --- discovery documents -----------------------------------------------------------------------

    def groups(self) -> dict[str, list[str]]:
        """Each group's versions, preferred first."""
        versions: dict[str, set[str]] = {}
        for rt in self._types.values():
            versions.setdefault(rt.group, set()).add(rt.version)
        return {g: sorted(v, key=version_priority) for g, v in sorted(versions.items())}

    def api_group(self, group: str) -> dict[str, Any] | None:
        versions = self.groups().get(group)
        if not versions or not group:
            return None
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": group,
            "versions": entries,
            "preferredVersion": entries[0],
        }

    def api_group_list(self) -> dict[str, Any]:
        groups = [self.api_group(g) for g in self.groups() if g]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [g for g in groups if g]}

    def resource_list(self, group: str, version: str) -> dict[str, Any] | None:
        types = [rt for rt in self._types.values() if rt.group == group and rt.version == version]
        if not types:
            return None
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": [entry for rt in sorted(types, key=lambda t: t.plural) for entry in rt.discovery()],
        }
