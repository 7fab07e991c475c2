"""The node and pod cache the decision reads: fed only by watches, or once from a static file.

Every change rebuilds the touched node's view and updates the index at once, so a decision only looks
things up. Load is what the API server already knows: the extended resources (GPUs, RDMA endpoints)
requested by the non-terminal pods bound to a node, against the node's allocatable. A request's own
content never reaches here.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nodefabric_devicemanager import yamldoc
from nodefabric_operator.extender import decisions
from nodefabric_operator.extender.config import ExtenderConfig, regular_file
from nodefabric_operator.extender.decisions import Claim
from nodefabric_operator.extender.groups import InvalidPlacement, group_of, pod_name, pod_namespace, pod_uid
from nodefabric_operator.extender.index import Index, NodeView
from nodefabric_operator.extender.nodes import NodeError, NodeRecord, QuantityError, parse_node, quantity
from nodefabric_operator.extender.placement import RANK_KEYS, Snapshot
from nodefabric_operator.extender.pods import PodError, pod_needs

log = logging.getLogger(__name__)

TERMINAL = frozenset({"Succeeded", "Failed"})
# PodGroup kinds whose minMember is a group's size: API group -> how its pods name it.
POD_GROUP_APIS = ("scheduling.x-k8s.io", "scheduling.volcano.sh")
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"


class SnapshotError(ValueError):
    """A static snapshot file cannot be used; the message names the item and field."""


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
    cpu: int = 0  # millicores
    claim: Claim | None = None  # what the extender persisted when it let the pod through
    decision: str | None = None  # the pod's decision annotation as the API last showed it


class Cache(Snapshot):
    def __init__(self, config: ExtenderConfig) -> None:
        super().__init__(Index(len(config.levels), pinned=config.indexed_homogeneity))
        self.config = config
        self.nodes: dict[str, NodeRecord] = {}
        self.pods: dict[str, PodRecord] = {}
        self.pods_on: dict[str, set[str]] = {}
        self.members: dict[str, set[str]] = {}  # group key -> pod uids
        # (api group, namespace, name) -> minMember
        self.pod_group_sizes: dict[tuple[str, str, str], int] = {}
        self.synced = False
        # Every node in each rank order, re-sorted only when a view changed (then nearly sorted: cheap).
        self._standing: dict[str, list[NodeView]] = {}
        self._stale: set[str] = set()
        self._resized = False

    # --- feeding ---------------------------------------------------------------------------------

    def upsert_node(self, obj: Mapping[str, Any]) -> None:
        """Take a node from the API. Raises NodeError for one the extender cannot read."""
        record = parse_node(obj)
        if record.name not in self.nodes:
            self._resized = True
        self.nodes[record.name] = record
        self._rebuild(record.name)

    def delete_node(self, name: str) -> None:
        self.nodes.pop(name, None)
        old = self.index.views.get(name)
        if old is not None:
            self.index.remove(old)
            self._resized = True

    def upsert_pod(self, obj: Mapping[str, Any]) -> None:
        uid = pod_uid(obj)
        old = self.pods.get(uid)
        try:
            spec = group_of(obj, self.config)
            group = spec.key if spec else None
        except InvalidPlacement as exc:
            group = exc.group  # the filter answers the error when the pod is scheduled
        try:
            needs = pod_needs(obj)
            requests, memory, cpu = dict(needs.extended), needs.memory, needs.cpu
        except PodError as exc:
            # The API server admitted it, so this is ours to tolerate: keep what was known of the pod.
            log.warning("could not read a pod's requests", extra={"pod": uid, "error": str(exc)})
            requests, memory, cpu = (dict(old.requests), old.memory, old.cpu) if old else ({}, 0, 0)
        meta = obj.get("metadata")
        annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
        annotations = annotations if isinstance(annotations, Mapping) else {}
        decided = annotations.get(decisions.keys(self.config)[0])
        spec_ = obj.get("spec")
        status = obj.get("status")
        node = spec_.get("nodeName") if isinstance(spec_, Mapping) else None
        record = PodRecord(
            uid=uid,
            namespace=pod_namespace(obj),
            name=pod_name(obj),
            node=node if isinstance(node, str) else "",
            terminal=isinstance(status, Mapping) and status.get("phase") in TERMINAL,
            requests=requests,
            memory=memory,
            cpu=cpu,
            group=group,
            claim=decisions.parse_claim(annotations, uid=uid, group=group, config=self.config),
            decision=decided if isinstance(decided, str) else None,
        )
        self._drop_pod(uid)
        self.pods[uid] = record
        if record.group:
            self.members.setdefault(record.group, set()).add(uid)
        if record.node:
            self.pods_on.setdefault(record.node, set()).add(uid)
            self._rebuild(record.node)

    def delete_pod(self, uid: str) -> str | None:
        """Forget a pod; returns its group key when that group has no pod left."""
        old = self._drop_pod(uid)
        if old is None or old.group is None:
            return None
        return old.group if old.group not in self.members else None

    def upsert_pod_group(self, api_group: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        try:
            size = quantity(spec.get("minMember", 0) if isinstance(spec, Mapping) else 0, whole=True)
        except QuantityError:
            size = 0
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

    def view_of(self, node: NodeRecord) -> NodeView:
        """The node as the decision sees it: its record against the pods the cache knows bound to it."""
        used: dict[str, int] = {}
        memory = count = cpu = 0
        for uid in self.pods_on.get(node.name, ()):
            pod = self.pods[uid]
            if pod.terminal:
                continue
            count += 1
            memory += pod.memory
            cpu += pod.cpu
            for k, v in pod.requests.items():
                used[k] = used.get(k, 0) + v
        free = {k: v - used.get(k, 0) for k, v in node.allocatable.items()}
        accel = self.config.accelerator_resources
        accel_alloc = sum(node.allocatable.get(r, 0) for r in accel)
        accel_free = sum(max(0, free.get(r, 0)) for r in accel)
        share = (accel_alloc - accel_free) / accel_alloc if accel_alloc else 0.0
        try:
            per_accel_mib = quantity(node.labels.get(self.config.accelerator_memory_label, "0"), whole=True)
        except QuantityError:
            per_accel_mib = 0
        return NodeView(
            name=node.name,
            labels=node.labels,
            locations=tuple(_location(node.labels, lv.keys) for lv in self.config.levels),
            free=free,
            allocatable=node.allocatable,
            load=(share, count),
            free_memory=(accel_free * per_accel_mib, node.memory - memory),
            record=node,
            spare=(node.cpu - cpu, node.memory - memory, node.pods - count),
            size=(node.cpu, node.memory, node.pods),
        )

    def _rebuild(self, name: str) -> None:
        node = self.nodes.get(name)
        if node is None:
            return
        self._stale.update(RANK_KEYS)
        self.index.add(self.view_of(node))

    # --- reading ---------------------------------------------------------------------------------

    def ranked(self, rank: str) -> list[NodeView]:
        """Every node in the rank policy's order."""
        order = self._standing.get(rank)
        if order is None or self._resized or rank in self._stale:
            views = self.index.views
            if order is None or self._resized:
                self._standing.clear()
                self._stale.update(RANK_KEYS)
                self._resized = False
                order = list(views.values())
            else:
                order = [views[v.name] for v in order]
            order.sort(key=RANK_KEYS[rank])
            self._standing[rank] = order
            self._stale.discard(rank)
        return order

    def bound_members(self, group: str, except_uid: str) -> list[PodRecord]:
        return [
            p
            for uid in self.members.get(group, ())
            if uid != except_uid and (p := self.pods[uid]).node and not p.terminal
        ]

    def group_pods(self, group: str) -> list[PodRecord]:
        return [self.pods[uid] for uid in self.members.get(group, ())]

    def group_pod_count(self, group: str) -> int:
        return sum(1 for uid in self.members.get(group, ()) if not self.pods[uid].terminal)

    def load_file(self, path: Path) -> None:
        """A static snapshot: a JSON or YAML List (or a plain list) of Node, Pod and PodGroup objects."""
        try:
            text = regular_file(path).read_text()
            data = json.loads(text) if path.suffix == ".json" else yamldoc.load(text)
        except (OSError, ValueError, yaml.YAMLError, RecursionError) as exc:
            raise SnapshotError(f"cannot read nodes file {path}: {exc}") from exc
        items = data.get("items") if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise SnapshotError(f"nodes file {path} must hold a list of objects or a List with items")
        self.load_objects(items, source=str(path))

    def load_objects(self, items: Iterable[Any], source: str = "snapshot") -> None:
        for i, obj in enumerate(items):
            kind = obj.get("kind", "Node") if isinstance(obj, dict) else None
            try:
                if kind == "Node":
                    self.upsert_node(obj)
                elif kind == "Pod":
                    self.upsert_pod(obj)
                elif kind == "PodGroup":
                    api = str(obj.get("apiVersion", "scheduling.x-k8s.io/")).split("/")[0]
                    self.upsert_pod_group(api, obj)
                else:
                    raise SnapshotError(f"{source}: item {i} is not a Node, Pod or PodGroup object")
            except NodeError as exc:
                raise SnapshotError(f"{source}: item {i}: {exc}") from None
        self.synced = True


def _location(labels: Mapping[str, str], keys: tuple[str, ...]) -> str | None:
    for i, key in enumerate(keys):
        value = labels.get(key)
        if value:
            # Values of different keys of one level must never look like one location.
            return value if i == 0 else f"{key}={value}"
    return None
