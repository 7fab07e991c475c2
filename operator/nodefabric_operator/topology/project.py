"""Projections of the checked hierarchy into what other schedulers read: pure functions to object bodies.

- Kueue `Topology` (kueue.x-k8s.io v1beta2, or v1beta1 where only that is served) and KAI `Topology`
  (kai.scheduler v1, or v1alpha1 where only that is served): `spec.levels[].nodeLabel`, loosest first,
  `kubernetes.io/hostname` last.
  Hostname last makes Kueue's levels mutable (its rule: levels may change only when hostname is the last
  level before and after) and lets both place pods on nodes within the lowest domain.
- Volcano `HyperNode`s (topology.volcano.sh/v1alpha1): one per value per projected level, `spec.tier`
  the level's place among the configured levels (0 for the tightest; a level left out leaves its tier
  empty rather than renumbering the others). A HyperNode holds the HyperNodes of the next tighter level
  by exact name, and the nodes that carry its level but no tighter projected level by a label match; the
  tightest tier holds its nodes by label match alone.

Only levels the check passed (`Hierarchy.projected`) appear in any of them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from nodefabric_devicemanager import vocabulary
from nodefabric_operator.topology.levels import HOSTNAME
from nodefabric_operator.topology.nesting import CheckedLevel, Hierarchy

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "nodefabric"
LEVEL_LABEL = vocabulary.TOPOLOGY_LEVEL_LABEL  # which level a HyperNode stands for

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSIONS = ("v1beta2", "v1beta1")  # preferred first
KUEUE_MAX_LEVELS = {"v1beta2": 16, "v1beta1": 8}
KAI_GROUP = "kai.scheduler"
KAI_VERSIONS = ("v1", "v1alpha1")  # preferred first: v1 is stored from the release that added it
KAI_MAX_LEVELS = 16
VOLCANO_GROUP, VOLCANO_VERSION = "topology.volcano.sh", "v1alpha1"

KUEUE, KAI, VOLCANO = "kueue", "kai", "volcano"
TARGETS = (KUEUE, KAI, VOLCANO)

_NOT_DNS = re.compile(r"[^a-z0-9-]+")


def managed_labels() -> dict[str, str]:
    return {MANAGED_BY: MANAGER}


def is_managed(obj: Mapping[str, Any]) -> bool:
    meta = obj.get("metadata")
    got = meta.get("labels") if isinstance(meta, Mapping) else None
    return isinstance(got, Mapping) and got.get(MANAGED_BY) == MANAGER


@dataclass(frozen=True)
class LevelList:
    """The node labels a Topology lists (loosest first, hostname last) and the levels left out for the
    target's own limit on their number."""

    node_labels: tuple[str, ...]
    dropped: tuple[str, ...] = ()


def level_list(hierarchy: Hierarchy, limit: int) -> LevelList:
    """Loosest first, hostname last; beyond `limit` the loosest levels go, as tight ones matter most."""
    keys = [lv.key for lv in reversed(hierarchy.projected) if lv.key is not None]
    room = max(limit - 1, 0)
    dropped = tuple(keys[: max(len(keys) - room, 0)])
    kept = keys[len(dropped) :]
    return LevelList(node_labels=(*kept, HOSTNAME), dropped=dropped)


def topology_body(api_version: str, name: str, node_labels: Sequence[str]) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": "Topology",
        "metadata": {"name": name, "labels": managed_labels()},
        "spec": {"levels": [{"nodeLabel": k} for k in node_labels]},
    }


def kueue_topology(hierarchy: Hierarchy, name: str, version: str) -> tuple[dict[str, Any], LevelList]:
    levels = level_list(hierarchy, KUEUE_MAX_LEVELS[version])
    return topology_body(f"{KUEUE_GROUP}/{version}", name, levels.node_labels), levels


def kai_topology(
    hierarchy: Hierarchy, name: str, version: str = KAI_VERSIONS[-1]
) -> tuple[dict[str, Any], LevelList]:
    levels = level_list(hierarchy, KAI_MAX_LEVELS)
    return topology_body(f"{KAI_GROUP}/{version}", name, levels.node_labels), levels


def held_by(obj: Mapping[str, Any] | None) -> str | None:
    """The finalizers keeping a live object that is being deleted (as text), or None when it is not."""
    meta = obj.get("metadata") if obj is not None else None
    if not isinstance(meta, Mapping) or not meta.get("deletionTimestamp"):
        return None
    got = meta.get("finalizers")
    return ", ".join(str(f) for f in got) if isinstance(got, list) and got else "[]"


def levels_of(obj: Mapping[str, Any] | None) -> tuple[str, ...] | None:
    """The nodeLabels a live Topology lists, or None for no object."""
    if obj is None:
        return None
    spec = obj.get("spec")
    levels = spec.get("levels") if isinstance(spec, Mapping) else None
    if not isinstance(levels, list):
        return ()
    return tuple(str(lv.get("nodeLabel", "")) for lv in levels if isinstance(lv, Mapping))


NONE, CREATE, UPDATE, REPLACE = "none", "create", "update", "replace"


def topology_action(
    live: Sequence[str] | None, desired: Sequence[str], *, mutable_with_hostname: bool
) -> str:
    """What bringing a Topology's levels from `live` to `desired` takes. Kueue lets levels change only when
    hostname is the last level before and after (`mutable_with_hostname`); KAI's levels never change.
    Anything else is a delete and a create (said in an Event)."""
    if live is None:
        return CREATE
    if tuple(live) == tuple(desired):
        return NONE
    if mutable_with_hostname and live and desired and live[-1] == HOSTNAME and desired[-1] == HOSTNAME:
        return UPDATE
    return REPLACE


def value_part(value: str) -> str:
    """A label value as one DNS-1123 label: lowercased, anything else made '-', and a hash of the original
    added whenever that changed anything, so "Rack-1", "rack.1" and "rack-1" never share a name."""
    part = _NOT_DNS.sub("-", value.lower()).strip("-") or "x"
    if part != value:
        part = f"{part[:52].rstrip('-')}-{hashlib.sha256(value.encode()).hexdigest()[:10]}"
    return part


NAME_MAX = 63  # Volcano's webhook checks a member's exactMatch.name as a qualified name: 63 at most


def hypernode_name(level: str, value: str) -> str:
    """`<level>.<value>`: the level name is a DNS label without dots (levels.check), so no two levels'
    names meet. Longer than 63 characters, it is cut and a hash of level and value added, so a parent can
    still name it: a DNS-1123 subdomain and a qualified name."""
    name = f"{level}.{value_part(value)}"
    if len(name) <= NAME_MAX:
        return name
    digest = hashlib.sha256(f"{level}/{value}".encode()).hexdigest()[:10]
    return f"{name[: NAME_MAX - 11].rstrip('-.')}-{digest}"


def hypernodes(
    hierarchy: Hierarchy, fleet: Mapping[str, Mapping[str, str]], taken: AbstractSet[str] = frozenset()
) -> dict[str, dict[str, Any]]:
    """Every HyperNode, by name. `fleet` is the same node labels the hierarchy was checked over; `taken`
    are names HyperNodes nodefabric does not manage hold: those domains are not written and no parent
    names them (Volcano allows a HyperNode one parent, and theirs may hold anything).

    A HyperNode's parent is the HyperNode of the nearest looser tier that every one of its nodes carries
    (one value: the levels nest), so a domain whose nodes lack the next tier still hangs under the one
    above. Where only some of its nodes carry a tier, it does not hang under that tier's HyperNode: a
    HyperNode never holds a node that lacks its label (a domain may look smaller to Volcano than it is,
    never larger, so a job asked to stay in one never spans two)."""
    tiers: Sequence[CheckedLevel] = hierarchy.projected
    keys = [lv.key or "" for lv in tiers]
    nodes_of: list[dict[str, list[Mapping[str, str]]]] = [{} for _ in tiers]
    direct: list[set[str]] = [set() for _ in tiers]
    for node_labels in fleet.values():
        tightest = None
        for t, key in enumerate(keys):
            value = node_labels.get(key)
            if value is not None:
                nodes_of[t].setdefault(value, []).append(node_labels)
                tightest = t if tightest is None else tightest
        if tightest is not None:
            direct[tightest].add(node_labels[keys[tightest]])
    children: list[dict[str, list[str]]] = [{v: [] for v in nodes_of[t]} for t in range(len(tiers))]
    for t in range(len(tiers)):
        for value, members in nodes_of[t].items():
            for u in range(t + 1, len(tiers)):
                if all(keys[u] in m for m in members):
                    children[u][members[0][keys[u]]].append(hypernode_name(tiers[t].name, value))
                    break
    # A tier is the level's place among the configured levels, whatever the fleet carries: a job asking
    # Volcano for a tier number keeps its meaning when a tighter level is left out (that tier is empty).
    position = {c.name: i for i, c in enumerate(hierarchy.levels)}
    out: dict[str, dict[str, Any]] = {}
    for t, lv in enumerate(tiers):
        for value in sorted(nodes_of[t]):
            spec_members: list[dict[str, Any]] = [
                {"type": "HyperNode", "selector": {"exactMatch": {"name": child}}}
                for child in sorted(children[t][value])
                if child in out  # tighter tiers are built first; one left out is not a member
            ]
            if value in direct[t]:
                spec_members.append(
                    {"type": "Node", "selector": {"labelMatch": _node_match(keys[t], value, keys[:t])}}
                )
            name = hypernode_name(lv.name, value)
            if not spec_members or name in taken:
                continue  # nothing to hold (every node sits in a tighter domain that cannot hang here), or
                # the name is someone else's: its nodes are then in no HyperNode of ours
            out[name] = {
                "apiVersion": f"{VOLCANO_GROUP}/{VOLCANO_VERSION}",
                "kind": "HyperNode",
                "metadata": {"name": name, "labels": {**managed_labels(), LEVEL_LABEL: lv.name}},
                "spec": {"tier": position[lv.name], "tierName": lv.name, "members": spec_members},
            }
    return out


def _node_match(key: str, value: str, tighter: Sequence[str]) -> dict[str, Any]:
    if not tighter:
        return {"matchLabels": {key: value}}
    # Nodes of this domain that no tighter HyperNode holds, so no node is a member twice.
    return {
        "matchLabels": {key: value},
        "matchExpressions": [{"key": k, "operator": "DoesNotExist"} for k in tighter],
    }


def spec_of(obj: Mapping[str, Any] | None) -> Any:
    return None if obj is None else obj.get("spec")
