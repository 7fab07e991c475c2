"""What the placement controller knows of the cluster: nodes, pods and PlacementGroups as its watches
deliver them, and the nodes admitted pods hold until they are bound.

Every watch event lands here (through `feeds`), bumps `generation` and wakes the loop. Only the loop's
thread touches these tables.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from nodefabric_devicemanager import vocabulary
from nodefabric_operator.admission import model, pins, podview
from nodefabric_operator.admission.model import PlacementGroupStatus
from nodefabric_operator.extender.cache import Cache
from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.extender.groups import GroupSpec
from nodefabric_operator.extender.nodes import NodeError
from nodefabric_operator.extender.watch import Feed

log = logging.getLogger(__name__)

# The phases whose PlacementGroup is the state of an admission in progress.
FOLLOWED = ("Admitted", "TimedOut")
# The phases whose members nodefabric let go (or is evicting): each stays its group's whatever its labels,
# and its PlacementGroup is written again when deleted by hand (it is the only record of which pods the
# admission gave their nodes).
CLAIMING = ("Admitted", "Bound", "TimedOut")


def _pg_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace")), str(meta.get("name"))


def _written_key(pg: Mapping[str, Any]) -> str:
    key = (pg.get("spec") or {}).get("key")
    return key if isinstance(key, str) else ""


def _same(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Two versions of a slimmed pod alike but for their resourceVersion."""
    if old["spec"] != new["spec"] or old["status"] != new["status"]:
        return False
    drop = ("resourceVersion",)
    meta_old = {k: v for k, v in old["metadata"].items() if k not in drop}
    return meta_old == {k: v for k, v in new["metadata"].items() if k not in drop}


def pg_key(spec: GroupSpec) -> tuple[str, str]:
    """(namespace, name) of the group's PlacementGroup."""
    return spec.key.split("/", 1)[0], model.object_name(spec.key)


def owns(pg: Mapping[str, Any], key: str) -> bool:
    """Whether the PlacementGroup is group `key`'s: names are changed to fit, so two keys can meet on
    one (a written key is never taken for another's)."""
    written = (pg.get("spec") or {}).get("key")
    return not written or written == key


class Tables:
    def __init__(self, config: ExtenderConfig) -> None:
        self.gate = vocabulary.scheduling_gate(config.domain)
        self.prefix = config.annotation_prefix
        self.cache = Cache(config)
        self.pods: dict[str, dict[str, Any]] = {}  # uid -> the pod, slimmed
        self.pgs: dict[tuple[str, str], dict[str, Any]] = {}  # (namespace, name) -> PlacementGroup
        # PlacementGroups of admitted, bound or timed-out groups deleted by someone else, as last seen:
        # written again from this while the group has pods, so a hand deletion never frees a group from
        # its timeout, nor makes its relabelled members or its bound pods strangers to it.
        self.lost: dict[tuple[str, str], dict[str, Any]] = {}
        self.held: dict[str, str] = {}  # uid -> node: admitted, not bound yet; counted as load
        self.cordoned: set[str] = set()  # nodes with spec.unschedulable
        # uid -> how many times what is kept of the pod changed: a new resourceVersion that changes
        # nothing kept (the decision copied onto it, a label no group reads) is no change of a group's.
        self.changes: dict[str, int] = {}
        # What others keep per pod uid (its group, the decision copied onto it): dropped with the pod.
        self.per_pod: list[dict[str, Any]] = [self.changes]
        # Bumped by every watch event.
        self.generation = 0
        # Bumped by every change that may give a waiting group room it did not have: a node changed
        # (added, relabelled, uncordoned, resized) or a pod counted on a node no longer counted there as
        # it was (gone, finished, its hold released). What only takes room (a pod bound where it was
        # held, a new hold) cannot make a waiting group fit, and leaves it alone.
        self.freed = 0
        self.wake = asyncio.Event()

    def feeds(self, core: Any, custom: Any) -> list[Feed]:
        def poke(f: Callable[..., None]) -> Callable[..., None]:
            def wrapped(*args: Any) -> None:
                f(*args)
                self.generation += 1
                self.wake.set()

            return wrapped

        def list_pgs(**kw: Any) -> Any:
            return custom.list_cluster_custom_object(model.GROUP, model.VERSION, model.PLURAL, **kw)

        return [
            Feed("nodes", core.list_node, poke(self.replace_nodes), poke(self.apply_node)),
            Feed("pods", core.list_pod_for_all_namespaces, poke(self.replace_pods), poke(self.apply_pod)),
            Feed("placementgroups", list_pgs, poke(self.replace_pgs), poke(self.apply_pg)),
        ]

    def gated(self, pod: Mapping[str, Any]) -> bool:
        return pins.gate_index(pod, self.gate) is not None

    # --- nodes -----------------------------------------------------------------------------------

    def _upsert_node(self, obj: dict[str, Any]) -> None:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        name = str(meta.get("name"))
        before = (self.cache.nodes.get(name), name in self.cordoned)
        if isinstance(spec, Mapping) and spec.get("unschedulable") is True:
            self.cordoned.add(name)
        else:
            self.cordoned.discard(name)
        try:
            self.cache.upsert_node(obj)
        except NodeError as exc:
            log.warning("could not read a node, kept what was known of it", extra={"error": str(exc)})
        # A status heartbeat that changes nothing the placement reads wakes no waiting group.
        if (self.cache.nodes.get(name), name in self.cordoned) != before:
            self.freed += 1

    def replace_nodes(self, items: list[dict[str, Any]]) -> None:
        keep = {str((i.get("metadata") or {}).get("name")) for i in items}
        self.cordoned &= keep
        for name in set(self.cache.nodes) - keep:
            self.freed += 1
            self.cache.delete_node(name)
        for item in items:
            self._upsert_node(item)

    def apply_node(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.freed += 1
            self.cordoned.discard(str((obj.get("metadata") or {}).get("name")))
            self.cache.delete_node(str((obj.get("metadata") or {}).get("name")))
        elif kind in ("ADDED", "MODIFIED"):
            self._upsert_node(obj)

    # --- pods and the nodes they hold ------------------------------------------------------------

    def feed_cache(self, uid: str) -> None:
        """The pod into the node cache; a held pod counts on its assigned node until it is bound."""
        pod = self.pods.get(uid)
        if pod is None:
            return
        node = self.held.get(uid)
        if node and not pod["spec"].get("nodeName"):
            pod = {**pod, "spec": {**pod["spec"], "nodeName": node}}
        before = self.load(uid)
        self.cache.upsert_pod(pod)
        if before is not None and self.load(uid) != before:
            self.freed += 1

    def load(self, uid: str) -> tuple[Any, ...] | None:
        """What the pod takes of a node as the cache counts it (None: nothing)."""
        record = self.cache.pods.get(uid)
        if record is None or not record.node or record.terminal:
            return None
        return record.node, tuple(sorted(record.requests.items())), record.memory, record.cpu

    def hold(self, uid: str, node: str) -> None:
        """An admitted, unbound pod counts on `node` from now on."""
        self.held[uid] = node
        self.feed_cache(uid)

    def upsert_pod(self, obj: dict[str, Any]) -> None:
        slim = podview.slim(obj, self.prefix)
        uid = podview.uid(slim)
        old = self.pods.get(uid)
        if old is not None and podview.rv(old) > podview.rv(slim) > 0:
            return  # an event older than the answer to our own patch, which is already here
        self.pods[uid] = slim
        if old is None or not _same(old, slim):
            self.changes[uid] = self.changes.get(uid, 0) + 1
        if slim["spec"].get("nodeName"):
            self.held.pop(uid, None)  # bound: the cache counts it where it runs
        self.feed_cache(uid)

    def _delete_pod(self, uid: str) -> None:
        self.pods.pop(uid, None)
        for table in self.per_pod:
            table.pop(uid, None)
        self.held.pop(uid, None)
        if self.load(uid) is not None:
            self.freed += 1
        self.cache.delete_pod(uid)

    def replace_pods(self, items: list[dict[str, Any]]) -> None:
        keep = {str((i.get("metadata") or {}).get("uid")) for i in items}
        for uid in set(self.pods) - keep:
            self._delete_pod(uid)
        for item in items:
            self.upsert_pod(item)

    def apply_pod(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self._delete_pod(str((obj.get("metadata") or {}).get("uid")))
        elif kind in ("ADDED", "MODIFIED"):
            self.upsert_pod(obj)

    def restore_holds(self) -> None:
        """Every admitted group's unbound members hold their nodes before any group is decided: after a
        restart or a change of leader the PlacementGroups are the state, whatever order groups come in."""
        for pg in self.pgs.values():
            status = pg.get("status") or {}
            if status.get("phase") != "Admitted":
                continue
            for m in status.get("members") or []:
                uid, node = m.get("uid"), m.get("node")
                pod = self.pods.get(uid) if isinstance(uid, str) else None
                if pod is None or not isinstance(node, str) or not node or pod["spec"].get("nodeName"):
                    continue
                if self.held.get(uid) != node:
                    self.hold(uid, node)

    # --- PlacementGroups -------------------------------------------------------------------------

    def replace_pgs(self, items: list[dict[str, Any]]) -> None:
        fresh = {_pg_key(i): i for i in items}
        for key, old in self.pgs.items():
            if key not in fresh:
                self._lose(key, old)
        for key in fresh:
            self.lost.pop(key, None)
        self.pgs = fresh

    def apply_pg(self, kind: str, obj: dict[str, Any]) -> None:
        key = _pg_key(obj)
        if kind == "DELETED":
            self._lose(key, self.pgs.pop(key, obj))
        elif kind in ("ADDED", "MODIFIED"):
            old = self.pgs.get(key)
            if old is None or podview.rv(obj) >= podview.rv(old):
                self.pgs[key] = obj
            self.lost.pop(key, None)

    def _lose(self, key: tuple[str, str], obj: dict[str, Any]) -> None:
        status = obj.get("status")
        if isinstance(status, Mapping) and status.get("phase") in CLAIMING:
            self.lost[key] = obj

    def followed(self) -> set[Any]:
        """The keys of groups whose PlacementGroup says an admission is under way, and of those whose
        PlacementGroup was deleted by hand (kept in `lost`), until it is written again."""
        under_way = {
            (pg.get("spec") or {}).get("key")
            for pg in self.pgs.values()
            if (pg.get("status") or {}).get("phase") in FOLLOWED
        }
        return under_way | {(pg.get("spec") or {}).get("key") for pg in self.lost.values()}

    def claims(self) -> dict[str, str]:
        """uid -> the group key whose admission holds the pod: a member of an admitted, bound or timed-out
        group, or one its group's PlacementGroup still lists on the node its admission gave it (the group
        decides again, a member replaced), stays that group's, whatever its labels say since (a user may
        edit them freely; the admission is nodefabric's). The first group by key wins, should two ever
        list one pod; a status of the wrong shape (a hand edit) claims nothing."""
        out: dict[str, str] = {}
        for pg in sorted([*self.pgs.values(), *self.lost.values()], key=_written_key):
            status, key = pg.get("status"), _written_key(pg)
            if not key or not isinstance(status, Mapping) or not isinstance(status.get("members"), list):
                continue
            # A group deciding again after one of its members went keeps the others it placed (with the
            # node it gave them) as its own, whatever its phase.
            every = status.get("phase") in CLAIMING
            for m in status["members"]:
                uid = m.get("uid") if isinstance(m, Mapping) else None
                if isinstance(uid, str) and uid and (every or m.get("node")):
                    out.setdefault(uid, key)
        return out

    def pg(self, spec: GroupSpec) -> tuple[dict[str, Any] | None, PlacementGroupStatus]:
        """The group's PlacementGroup (None when there is none) and its status as this process reads it."""
        key = pg_key(spec)
        pg = self.pgs.get(key)
        if pg is None:
            lost = self.lost.get(key)
            if lost is None or (lost.get("spec") or {}).get("key") != spec.key:
                return None, PlacementGroupStatus()
            # Deleted by someone else: carried on from what we last wrote, and written again (writer).
            with contextlib.suppress(ValueError):
                return None, PlacementGroupStatus.model_validate(lost.get("status") or {})
            return None, PlacementGroupStatus()
        try:
            return pg, PlacementGroupStatus.model_validate(pg.get("status") or {})
        except ValueError:
            # Only we write it; an unreadable status (an older version, a hand edit) starts over.
            log.warning("unreadable PlacementGroup status, starting over", extra={"group": spec.key})
            return pg, PlacementGroupStatus()
