"""The node and pod cache the decision reads: fed by watches, or once from a static file.

Every change rebuilds the touched node's NodeView at once, so a decision only looks views up.
Load is what the API server already knows: the extended resources (GPUs, RDMA endpoints) requested
by the non-terminal pods bound to a node, against the node's allocatable.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from functools import reduce
from operator import or_
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes.utils import parse_quantity

from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.extender.groups import InvalidPlacement, group_of, pod_name, pod_namespace, pod_uid
from nodefabric_operator.extender.placement import RANK_KEYS, Index, NodeView

log = logging.getLogger(__name__)

TERMINAL = frozenset({"Succeeded", "Failed"})
# PodGroup kinds whose minMember is a group's size: API group -> how its pods name it.
POD_GROUP_APIS = ("scheduling.x-k8s.io", "scheduling.volcano.sh")
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"


class SnapshotError(ValueError):
    """A static snapshot file cannot be used."""


def _is_extended(resource: str) -> bool:
    domain, slash, _ = resource.partition("/")
    return bool(slash) and not domain.endswith("kubernetes.io")


_parse_quantity = cast(Callable[[object], Decimal], parse_quantity)


def _int(value: object) -> int:
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    try:
        return int(_parse_quantity(value))
    except (ValueError, TypeError, ArithmeticError):
        return 0


def pod_requests(pod: Mapping[str, Any]) -> tuple[dict[str, int], int]:
    """Extended resources and memory (bytes) one pod asks for: containers summed, init containers' max."""
    spec = pod.get("spec") or {}
    total: dict[str, int] = {}
    memory = 0

    def one(container: Mapping[str, Any]) -> tuple[dict[str, int], int]:
        res = container.get("resources") or {}
        # Extended resources may be given as limits only; the API server then copies them to requests.
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        ext = {k: _int(v) for k, v in merged.items() if _is_extended(k)}
        return {k: v for k, v in ext.items() if v > 0}, _int(merged.get("memory", 0))

    for c in spec.get("containers") or []:
        ext, mem = one(c)
        for k, v in ext.items():
            total[k] = total.get(k, 0) + v
        memory += mem
    for c in spec.get("initContainers") or []:
        ext, mem = one(c)
        for k, v in ext.items():
            total[k] = max(total.get(k, 0), v)
        memory = max(memory, mem)
    return total, memory


@dataclass(frozen=True, slots=True)
class PodRecord:
    uid: str
    namespace: str
    name: str
    node: str  # "" while not bound
    terminal: bool
    requests: Mapping[str, int]
    memory: int
    group: str | None


@dataclass(frozen=True, slots=True)
class NodeRecord:
    name: str
    labels: Mapping[str, str]
    allocatable: Mapping[str, int]  # extended resources
    memory: int  # allocatable bytes


class Cache:
    def __init__(self, config: ExtenderConfig) -> None:
        self.config = config
        self.nodes: dict[str, NodeRecord] = {}
        self.views: dict[str, NodeView] = {}
        self.pods: dict[str, PodRecord] = {}
        self.pods_on: dict[str, set[str]] = {}
        self.members: dict[str, set[str]] = {}  # group key -> pod uids
        self.pod_group_sizes: dict[
            tuple[str, str, str], int
        ] = {}  # (api group, namespace, name) -> minMember
        self.synced = False
        # Every node in each rank order, re-sorted only when a view changed (then nearly sorted: cheap).
        self._ranked: dict[str, list[NodeView]] = {}
        self._stale: set[str] = set()
        self._resized = False
        self._present: int | None = None
        self.index = Index.empty(len(config.levels))
        self.names: set[str] = set()  # the keys of `views`, as a set for fast intersections

    # --- feeding ---------------------------------------------------------------------------------

    def upsert_node(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            log.warning("ignored a node without a name")
            return
        alloc = (obj.get("status") or {}).get("allocatable") or {}
        self.nodes[name] = NodeRecord(
            name=name,
            labels=dict(meta.get("labels") or {}),
            allocatable={k: _int(v) for k, v in alloc.items() if _is_extended(k)},
            memory=_int(alloc.get("memory", 0)),
        )
        self._present = None
        self._rebuild(name)

    def delete_node(self, name: str) -> None:
        self._present = None
        self.nodes.pop(name, None)
        old = self.views.pop(name, None)
        if old is not None:
            self.index.remove(old)
            self.names.discard(name)
            self._resized = True

    def upsert_pod(self, obj: Mapping[str, Any]) -> None:
        try:
            spec = group_of(obj, self.config)
            group = spec.key if spec else None
        except InvalidPlacement:
            group = None  # the filter answers the error when the pod is scheduled
        requests, memory = pod_requests(obj)
        record = PodRecord(
            uid=pod_uid(obj),
            namespace=pod_namespace(obj),
            name=pod_name(obj),
            node=str((obj.get("spec") or {}).get("nodeName") or ""),
            terminal=(obj.get("status") or {}).get("phase") in TERMINAL,
            requests=requests,
            memory=memory,
            group=group,
        )
        self._drop_pod(record.uid)
        self.pods[record.uid] = record
        if record.group:
            self.members.setdefault(record.group, set()).add(record.uid)
        if record.node:
            self.pods_on.setdefault(record.node, set()).add(record.uid)
            self._rebuild(record.node)

    def delete_pod(self, uid: str) -> str | None:
        """Forget a pod; returns its group key when that group has no pod left."""
        old = self._drop_pod(uid)
        if old is None or old.group is None:
            return None
        return old.group if old.group not in self.members else None

    def upsert_pod_group(self, api_group: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        size = _int((obj.get("spec") or {}).get("minMember", 0))
        key = (api_group, str(meta.get("namespace") or "default"), str(meta.get("name") or ""))
        if size > 0:
            self.pod_group_sizes[key] = size
        else:
            self.pod_group_sizes.pop(key, None)

    def delete_pod_group(self, api_group: str, namespace: str, name: str) -> None:
        self.pod_group_sizes.pop((api_group, namespace, name), None)

    def _drop_pod(self, uid: str) -> PodRecord | None:
        old = self.pods.pop(uid, None)
        if old is None:
            return None
        if old.group:
            uids = self.members.get(old.group)
            if uids is not None:
                uids.discard(uid)
                if not uids:
                    del self.members[old.group]
        if old.node:
            self.pods_on.get(old.node, set()).discard(uid)
            self._rebuild(old.node)
        return old

    def _rebuild(self, name: str) -> None:
        node = self.nodes.get(name)
        if node is None:
            return
        used: dict[str, int] = {}
        memory = count = 0
        for uid in self.pods_on.get(name, ()):
            pod = self.pods[uid]
            if pod.terminal:
                continue
            count += 1
            memory += pod.memory
            for k, v in pod.requests.items():
                used[k] = used.get(k, 0) + v
        free = {k: v - used.get(k, 0) for k, v in node.allocatable.items()}
        accel = self.config.accelerator_resources
        accel_alloc = sum(node.allocatable.get(r, 0) for r in accel)
        accel_free = sum(max(0, free.get(r, 0)) for r in accel)
        share = (accel_alloc - accel_free) / accel_alloc if accel_alloc else 0.0
        per_accel_mib = _int(node.labels.get(self.config.accelerator_memory_label, 0))
        levels = self.config.levels
        old = self.views.get(name)
        if old is None:
            self._resized = True
            self.names.add(name)
        else:
            self.index.remove(old)
        self._stale.update(RANK_KEYS)
        view = self.views[name] = NodeView(
            name=name,
            labels=node.labels,
            locations=tuple(_location(node.labels, lv.keys) for lv in levels),
            free=free,
            allocatable=node.allocatable,
            load=(share, count),
            free_memory=(accel_free * per_accel_mib, node.memory - memory),
            homog=tuple(node.labels.get(k, "") for k in self.config.homogeneous_keys),
        )
        self.index.add(view)

    # --- reading ---------------------------------------------------------------------------------

    @property
    def present(self) -> int:
        """Bitmask of the levels at which at least one node has a value."""
        if self._present is None:
            self._present = reduce(or_, (v.mask for v in self.views.values()), 0)
        return self._present

    def ranked(self, rank: str) -> list[NodeView]:
        """Every node in the rank policy's order."""
        order = self._ranked.get(rank)
        if order is None or self._resized or rank in self._stale:
            if order is None or self._resized:
                self._ranked.clear()
                self._stale.update(RANK_KEYS)
                self._resized = False
                order = list(self.views.values())
            else:
                views = self.views
                order = [views[v.name] for v in order]
            order.sort(key=RANK_KEYS[rank])
            self._ranked[rank] = order
            self._stale.discard(rank)
        return order

    def bound_members(self, group: str, except_uid: str) -> list[PodRecord]:
        return [
            p
            for uid in self.members.get(group, ())
            if uid != except_uid and (p := self.pods[uid]).node and not p.terminal
        ]

    def group_pod_count(self, group: str) -> int:
        return sum(1 for uid in self.members.get(group, ()) if not self.pods[uid].terminal)

    def load_file(self, path: Path) -> None:
        """A static snapshot: a JSON or YAML List (or a plain list) of Node, Pod and PodGroup objects."""
        try:
            text = path.read_text()
            data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise SnapshotError(f"cannot read nodes file {path}: {exc}") from exc
        items = data.get("items") if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise SnapshotError(f"nodes file {path} must hold a list of objects or a List with items")
        self.load_objects(items, source=str(path))

    def load_objects(self, items: Iterable[Any], source: str = "snapshot") -> None:
        for i, obj in enumerate(items):
            kind = obj.get("kind", "Node") if isinstance(obj, dict) else None
            if kind == "Node":
                self.upsert_node(obj)
            elif kind == "Pod":
                self.upsert_pod(obj)
            elif kind == "PodGroup":
                api = str(obj.get("apiVersion", "scheduling.x-k8s.io/")).split("/")[0]
                self.upsert_pod_group(api, obj)
            else:
                raise SnapshotError(f"{source}: item {i} is not a Node, Pod or PodGroup object")
        self.synced = True


def _location(labels: Mapping[str, str], keys: tuple[str, ...]) -> str | None:
    for i, key in enumerate(keys):
        value = labels.get(key)
        if value:
            # Values of different keys of one level must never look like one location.
            return value if i == 0 else f"{key}={value}"
    return None
