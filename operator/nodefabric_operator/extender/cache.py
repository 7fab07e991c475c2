"""The node and pod cache the decision reads: fed only by watches, or once from a static file.

Every change rebuilds the touched node's view and updates the index at once, so a decision only looks
things up. Load is what the API server already knows: the extended resources (GPUs, RDMA endpoints)
requested by the non-terminal pods bound to a node, against the node's allocatable. A request's own
content never reaches here. A pod is kept as the few fields placement reads (bounded in size); no
annotation value is kept, and none is read back as state. Admitted groups come from their
PlacementGroups, which only nodefabric's placement process writes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nodefabric_devicemanager import vocabulary, yamldoc
from nodefabric_operator.extender.config import ExtenderConfig, regular_file
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
DEFAULT_SCHEDULER = "default-scheduler"
# PlacementGroup phases in which its members' nodes are assigned.
ADMITTED_PHASES = frozenset({"Admitted", "Bound"})
# Bounds on what one PlacementGroup may make the cache hold (the CRD's own limits are tighter).
MAX_MEMBERS = 10_000
MAX_DECISION = 4096


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
    scheduler: str = DEFAULT_SCHEDULER  # spec.schedulerName: only pods of one scheduler are one group


@dataclass(frozen=True, slots=True)
class Admission:
    """An admitted group as its PlacementGroup records it: each member's assigned node, and the text."""

    key: str
    phase: str
    nodes: Mapping[str, str]  # pod uid -> assigned node
    decision: str

    @property
    def admitted(self) -> bool:
        return self.phase in ADMITTED_PHASES


def parse_admission(obj: Mapping[str, Any]) -> Admission | None:
    """A PlacementGroup as the extender reads it; None when it names no group of its own namespace."""
    meta, spec, status = (obj.get(k) for k in ("metadata", "spec", "status"))
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        return None
    key, ns = spec.get("key"), meta.get("namespace")
    if not isinstance(key, str) or not isinstance(ns, str) or not key.startswith(f"{ns}/") or len(key) > 1024:
        return None
    status = status if isinstance(status, Mapping) else {}
    phase = status.get("phase")
    decision = status.get("decision")
    members = status.get("members")
    nodes: dict[str, str] = {}
    if isinstance(members, list):
        for m in members[:MAX_MEMBERS]:
            if isinstance(m, Mapping):
                uid, node = m.get("uid"), m.get("node")
                if isinstance(uid, str) and uid and isinstance(node, str) and node:
                    nodes[uid] = node[:253]
    return Admission(
        key=key,
        phase=phase if isinstance(phase, str) else "",
        nodes=nodes,
        decision=decision[:MAX_DECISION] if isinstance(decision, str) else "",
    )


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
        # group key -> its PlacementGroup; (namespace, object name) -> group key, for deletions
        self.admissions: dict[str, Admission] = {}
        self._admission_keys: dict[tuple[str, str], str] = {}
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
        spec_ = obj.get("spec")
        status = obj.get("status")
        node = spec_.get("nodeName") if isinstance(spec_, Mapping) else None
        scheduler = spec_.get("schedulerName") if isinstance(spec_, Mapping) else None
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
            scheduler=scheduler[:253] if isinstance(scheduler, str) and scheduler else DEFAULT_SCHEDULER,
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

    def upsert_placement_group(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        ref = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        self.delete_placement_group(*ref)
        admission = parse_admission(obj)
        if admission is not None:
            self.admissions[admission.key] = admission
            self._admission_keys[ref] = admission.key

    def admission_refs(self) -> list[tuple[str, str]]:
        """(namespace, name) of every PlacementGroup the cache holds."""
        return list(self._admission_keys)

    def delete_placement_group(self, namespace: str, name: str) -> None:
        key = self._admission_keys.pop((namespace, name), None)
        if key is not None:
            self.admissions.pop(key, None)

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

    # A group's members are its pods that use the same scheduler and are not terminal: pods of another
    # scheduler carrying the same labels (a Job's job-name, say) never count.

    def bound_members(self, group: str, except_uid: str, scheduler: str) -> list[PodRecord]:
        return [
            p
            for uid in self.members.get(group, ())
            if uid != except_uid
            and (p := self.pods[uid]).node
            and not p.terminal
            and p.scheduler == scheduler
        ]

    def group_pods(self, group: str, scheduler: str) -> list[PodRecord]:
        return [p for uid in self.members.get(group, ()) if (p := self.pods[uid]).scheduler == scheduler]

    def group_pod_count(self, group: str, scheduler: str) -> int:
        return sum(
            1
            for uid in self.members.get(group, ())
            if not (p := self.pods[uid]).terminal and p.scheduler == scheduler
        )

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
                elif kind == vocabulary.PLACEMENT_GROUP_KIND:
                    self.upsert_placement_group(obj)
                elif kind == "PodGroup":
                    api = str(obj.get("apiVersion", "scheduling.x-k8s.io/")).split("/")[0]
                    self.upsert_pod_group(api, obj)
                else:
                    raise SnapshotError(
                        f"{source}: item {i} is not a Node, Pod, PodGroup or PlacementGroup object"
                    )
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
