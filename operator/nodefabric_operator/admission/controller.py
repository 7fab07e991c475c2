"""The placement controller: admits whole groups by removing their scheduling gates. Level-based.

Watches nodes, pods and PlacementGroups (list+watch threads, the extender's machinery). Every change wakes
one loop that reconciles each group in turn, oldest first, against one view of free capacity:

- not admitted: work out the expected size (owners.py), run the pure rule (admit.py); write the outcome
  to the PlacementGroup (only when it changed). When admitted: the assignment goes to the PlacementGroup
  status FIRST, the group's pods then hold their nodes in the cache against the next group, and each pod
  is pinned to its node and our gate removed. The stock kube-scheduler binds them.
- admitted: follow binding and readiness; carry on pinning/ungating after a restart (the status is the
  state); a group not entirely bound and Ready within `groupReadyTimeoutSeconds` gets its pods evicted,
  a reason on the PlacementGroup, a Warning Event, and a bounded backoff before it is admitted afresh.

Nothing a pod carries is read back as state: the cache keeps only the annotations the group is named and
sized by (inputs from the pod template), never a claim or a decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from nodefabric_devicemanager import vocabulary
from nodefabric_devicemanager.backoff import Backoff
from nodefabric_operator.admission import model, pins
from nodefabric_operator.admission.admit import Member, Verdict, admit
from nodefabric_operator.admission.metrics import PlacementMetrics
from nodefabric_operator.admission.model import Phase, PlacementGroupStatus
from nodefabric_operator.admission.owners import (
    LWS_NAME,
    Owner,
    OwnerFetcher,
    OwnerRef,
    Size,
    controls,
    owner_ref,
    resolve,
)
from nodefabric_operator.extender.cache import TERMINAL, Cache
from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.extender.events import KubePublisher
from nodefabric_operator.extender.groups import (
    FAMILIES,
    LWS_GROUP_INDEX,
    GroupSpec,
    InvalidPlacement,
    group_of,
)
from nodefabric_operator.extender.nodes import NodeError
from nodefabric_operator.extender.pods import PodError, pod_needs
from nodefabric_operator.extender.watch import Feed, Watcher

log = logging.getLogger(__name__)

COMPONENT = "nodefabric-placement"
# Annotations kept of a pod: only what names, sizes and shapes its group (template inputs). Values longer
# than this are cut (group_of refuses them with a reason anyway): a 250 KB annotation costs nothing here.
MAX_KEPT = 1024
SIZE_TTL_S = 5.0  # an owner's count is read again after this long while its group waits
BACKOFF_BASE_S = 5.0
BACKOFF_CAP_S = 300.0
# The labels a pod's group is named and sized by (besides the placement.<domain>/ keys kept as annotations).
GROUP_LABELS = frozenset(
    [label for _, label, _ in FAMILIES]
    + [size for _, _, size in FAMILIES if size]
    + [LWS_GROUP_INDEX, LWS_NAME]
)
TICK_S = 1.0  # timeouts and backoffs are looked at this often even when nothing changes


def _now_dt(now: float) -> datetime:
    # Milliseconds kept: a timeout of a few seconds must not lose up to one of them to rounding.
    return datetime.fromtimestamp(round(now, 3), UTC)


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(
        isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
    )


def _created(pod: Mapping[str, Any]) -> float:
    text = (pod.get("metadata") or {}).get("creationTimestamp")
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


@dataclass
class GroupView:
    """One group's pods as this pass sees them."""

    spec: GroupSpec
    scheduler: str
    members: list[dict[str, Any]]  # same namespace, key and scheduler; not terminal, not being deleted
    invalid: str = ""  # an InvalidPlacement on one of its members (worked out once the owner is known)
    owner: Owner | None = None  # once read: what states the size (and owns the PlacementGroup)
    # Every live pod of the key, whatever its scheduler: the owner's pods are picked from these.
    candidates: list[dict[str, Any]] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # uid -> the InvalidPlacement of a gated pod


class Controller:
    def __init__(
        self,
        config: ExtenderConfig,
        api: client.ApiClient,
        *,
        metrics: PlacementMetrics | None = None,
        clock: Callable[[], float] = time.time,
        leading: Callable[[], bool] = lambda: True,
        backoff_base: float = BACKOFF_BASE_S,
    ) -> None:
        self.config = config
        self.gate = vocabulary.scheduling_gate(config.domain)
        self.decision_key = vocabulary.placement_key(vocabulary.DECISION, config.domain)
        self.cache = Cache(config)
        self.metrics = metrics or PlacementMetrics()
        self.clock = clock
        self.leading = leading
        self.backoff_base = backoff_base
        self.core: Any = client.CoreV1Api(api)  # takes plain dicts as readily as its models
        self.custom: Any = client.CustomObjectsApi(api)
        self.owners = OwnerFetcher(api)
        self.publisher = KubePublisher(
            self.core,
            self.metrics.registry,
            component=COMPONENT,
            metric="nodefabric_placement_writes_failed",
            clock=clock,  # the spam filter runs on the controller's clock
        )
        self.pods: dict[str, dict[str, Any]] = {}  # uid -> the pod, slimmed
        self.pgs: dict[tuple[str, str], dict[str, Any]] = {}  # (namespace, name) -> PlacementGroup
        # PlacementGroups of admitted or timed-out groups deleted by someone else, as last seen: written
        # again from this while the group has pods, so a hand deletion never frees a group from its timeout.
        self.lost: dict[tuple[str, str], dict[str, Any]] = {}
        self.held: dict[str, str] = {}  # uid -> node: admitted, not bound yet; counted as load
        self.cordoned: set[str] = set()  # nodes with spec.unschedulable
        self.sizes: dict[OwnerRef, tuple[float, Owner]] = {}
        self.annotated: dict[str, str] = {}  # uid -> decision text last copied onto the pod
        self.group_cache: dict[str, tuple[dict[str, Any], tuple[GroupSpec | None, str, str]]] = {}
        # Bumped by every watch event: a waiting group is decided again only when something changed
        # (or its owner may have, every SIZE_TTL_S).
        self.generation = 0
        self.evaluated: dict[str, tuple[int, float]] = {}  # group key -> (generation, when)
        self.wake = asyncio.Event()
        self.watcher = Watcher(self.cache, None, api, feeds=self._feeds())
        self.passes = 0

    # --- feeds -----------------------------------------------------------------------------------

    def _feeds(self) -> list[Feed]:
        def poke(f: Callable[..., None]) -> Callable[..., None]:
            def wrapped(*args: Any) -> None:
                f(*args)
                self.generation += 1
                self.wake.set()

            return wrapped

        def list_pgs(**kw: Any) -> Any:
            return self.custom.list_cluster_custom_object(model.GROUP, model.VERSION, model.PLURAL, **kw)

        return [
            Feed("nodes", self.core.list_node, poke(self._replace_nodes), poke(self._apply_node)),
            Feed(
                "pods", self.core.list_pod_for_all_namespaces, poke(self._replace_pods), poke(self._apply_pod)
            ),
            Feed("placementgroups", list_pgs, poke(self._replace_pgs), poke(self._apply_pg)),
        ]

    def _upsert_node(self, obj: dict[str, Any]) -> None:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        name = str(meta.get("name"))
        if isinstance(spec, Mapping) and spec.get("unschedulable") is True:
            self.cordoned.add(name)
        else:
            self.cordoned.discard(name)
        try:
            self.cache.upsert_node(obj)
        except NodeError as exc:
            log.warning("could not read a node, kept what was known of it", extra={"error": str(exc)})

    def _replace_nodes(self, items: list[dict[str, Any]]) -> None:
        keep = {str((i.get("metadata") or {}).get("name")) for i in items}
        self.cordoned &= keep
        for name in set(self.cache.nodes) - keep:
            self.cache.delete_node(name)
        for item in items:
            self._upsert_node(item)

    def _apply_node(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.cordoned.discard(str((obj.get("metadata") or {}).get("name")))
            self.cache.delete_node(str((obj.get("metadata") or {}).get("name")))
        elif kind in ("ADDED", "MODIFIED"):
            self._upsert_node(obj)

    def _slim(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """What the controller keeps of a pod: identity, the group's naming/sizing inputs, the scheduling
        fields it reads and patches, and readiness. No claim, no decision, no long value."""
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        prefix = self.config.annotation_prefix
        raw_annotations = meta.get("annotations")
        annotations: Mapping[str, Any] = raw_annotations if isinstance(raw_annotations, Mapping) else {}
        kept_keys = {prefix + k for k in vocabulary.GROUP_ANNOTATIONS}
        kept_keys.add("kueue.x-k8s.io/pod-group-total-count")
        kept = {k: str(v)[:MAX_KEPT] for k, v in annotations.items() if k in kept_keys}
        raw_labels = meta.get("labels")
        # Labels likewise: only those that name and size a group (group_of, owner_ref); the rest, however
        # many (a pod's labels have no bound but the object's size), are not kept.
        labels = {
            k: str(v)[:MAX_KEPT]
            for k, v in (raw_labels.items() if isinstance(raw_labels, Mapping) else ())
            if k in kept_keys or k in GROUP_LABELS
        }

        def containers(key: str) -> Any:
            raw = spec.get(key)
            if not isinstance(raw, list):
                return raw  # pod_needs names the bad field
            return [
                {k: c.get(k) for k in ("resources", "restartPolicy") if k in c}
                if isinstance(c, Mapping)
                else c
                for c in raw
            ]

        slim_spec = {
            k: spec[k]
            for k in (
                "schedulerName",
                "nodeName",
                "schedulingGates",
                "affinity",
                "nodeSelector",
                "tolerations",
                "overhead",
                "schedulingGroup",
                "workloadRef",
            )
            if k in spec
        }
        slim_spec["containers"] = containers("containers")
        if "initContainers" in spec:
            slim_spec["initContainers"] = containers("initContainers")
        conditions = status.get("conditions")
        refs = meta.get("ownerReferences")
        # Only the controller reference is read (controls, owner_ref); a pod may carry thousands of others.
        controller = [
            {k: r.get(k) for k in ("apiVersion", "kind", "name", "uid", "controller")}
            for r in (refs if isinstance(refs, list) else [])
            if isinstance(r, Mapping) and r.get("controller") is True
        ][:1]
        return {
            "metadata": {
                k: meta[k]
                for k in (
                    "name",
                    "namespace",
                    "uid",
                    "creationTimestamp",
                    "deletionTimestamp",
                    "resourceVersion",
                )
                if k in meta
            }
            | {"labels": labels, "annotations": kept, "ownerReferences": controller},
            "spec": slim_spec,
            "status": {
                "phase": status.get("phase"),
                "conditions": [c for c in conditions if isinstance(c, Mapping) and c.get("type") == "Ready"]
                if isinstance(conditions, list)
                else [],
            },
        }

    def _feed_cache(self, uid: str) -> None:
        """The pod into the node cache; a held pod counts on its assigned node until it is bound."""
        pod = self.pods.get(uid)
        if pod is None:
            return
        node = self.held.get(uid)
        if node and not pod["spec"].get("nodeName"):
            pod = {**pod, "spec": {**pod["spec"], "nodeName": node}}
        self.cache.upsert_pod(pod)

    def _upsert_pod(self, obj: dict[str, Any]) -> None:
        slim = self._slim(obj)
        uid = str(slim["metadata"].get("uid"))
        old = self.pods.get(uid)
        if old is not None and _rv(old) > _rv(slim) > 0:
            return  # an event older than the answer to our own patch, which is already here
        self.pods[uid] = slim
        if slim["spec"].get("nodeName"):
            self.held.pop(uid, None)  # bound: the cache counts it where it runs
        self._feed_cache(uid)

    def _delete_pod(self, uid: str) -> None:
        self.pods.pop(uid, None)
        self.group_cache.pop(uid, None)
        self.held.pop(uid, None)
        self.annotated.pop(uid, None)
        self.cache.delete_pod(uid)

    def _replace_pods(self, items: list[dict[str, Any]]) -> None:
        keep = {str((i.get("metadata") or {}).get("uid")) for i in items}
        for uid in set(self.pods) - keep:
            self._delete_pod(uid)
        for item in items:
            self._upsert_pod(item)

    def _apply_pod(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self._delete_pod(str((obj.get("metadata") or {}).get("uid")))
        elif kind in ("ADDED", "MODIFIED"):
            self._upsert_pod(obj)

    def _pg_key(self, obj: Mapping[str, Any]) -> tuple[str, str]:
        meta = obj.get("metadata") or {}
        return str(meta.get("namespace")), str(meta.get("name"))

    def _replace_pgs(self, items: list[dict[str, Any]]) -> None:
        fresh = {self._pg_key(i): i for i in items}
        for key, old in self.pgs.items():
            if key not in fresh:
                self._lose(key, old)
        for key in fresh:
            self.lost.pop(key, None)
        self.pgs = fresh

    def _apply_pg(self, kind: str, obj: dict[str, Any]) -> None:
        key = self._pg_key(obj)
        if kind == "DELETED":
            self._lose(key, self.pgs.pop(key, obj))
        elif kind in ("ADDED", "MODIFIED"):
            old = self.pgs.get(key)
            if old is None or _rv(obj) >= _rv(old):
                self.pgs[key] = obj
            self.lost.pop(key, None)

    def _lose(self, key: tuple[str, str], obj: dict[str, Any]) -> None:
        if (obj.get("status") or {}).get("phase") in ("Admitted", "TimedOut"):
            self.lost[key] = obj

    # --- the loop --------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        self.watcher.start(asyncio.get_running_loop())
        try:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), TICK_S)
                self.wake.clear()
                if stop.is_set():
                    break
                if not self.cache.synced or not self.leading():
                    continue
                try:
                    await self.reconcile_all()
                except Exception:
                    log.exception("a reconcile pass failed; the next one starts over")
        finally:
            self.watcher.stop()
            await self.publisher.drain()

    def groups(self) -> list[GroupView]:
        """Every group with a gated pod or a PlacementGroup to follow, oldest first."""
        by_key: dict[str, list[tuple[GroupSpec | None, dict[str, Any], str]]] = {}
        specs: dict[str, GroupSpec] = {}
        for uid, pod in self.pods.items():
            spec, key, error = self._group_of(uid, pod)
            if error:
                if key and self._gated(pod):
                    by_key.setdefault(key, []).append((None, pod, error))
                continue
            if spec is None:
                continue
            specs.setdefault(spec.key, spec)
            by_key.setdefault(spec.key, []).append((spec, pod, ""))
        followed = {
            (pg.get("spec") or {}).get("key")
            for pg in [*self.pgs.values(), *self.lost.values()]
            if (pg.get("status") or {}).get("phase") in ("Admitted", "TimedOut")
        }
        out = []
        for key, entries in by_key.items():
            pods = [p for _, p, _ in entries]
            gated = [p for p in pods if self._gated(p)]
            if not gated and key not in followed:
                continue
            errors = {str(p["metadata"].get("uid")): err for _, p, err in entries if err}
            spec = specs.get(key)
            if spec is None:
                _ns, family, name = ([*key.split("/", 2), "", ""])[:3]
                spec = GroupSpec(key, family, name, None, "prefer", "spread", None)
            live = [
                p
                for p in pods
                if (p["status"].get("phase") not in TERMINAL) and not p["metadata"].get("deletionTimestamp")
            ]
            scheduler = self._scheduler_of(gated or pods)
            members = [p for p in live if _scheduler(p) == scheduler]
            out.append(GroupView(spec, scheduler, members, candidates=live, errors=errors))
        out.sort(key=lambda g: (min((_created(p) for p in g.members), default=0.0), g.spec.key))
        return out

    def _group_of(self, uid: str, pod: dict[str, Any]) -> tuple[GroupSpec | None, str, str]:
        """The pod's group (spec, key, error), worked out once per version of the pod."""
        cached = self.group_cache.get(uid)
        if cached is not None and cached[0] is pod:
            return cached[1]
        try:
            spec = group_of(pod, self.config)
            found: tuple[GroupSpec | None, str, str] = (spec, spec.key if spec else "", "")
        except InvalidPlacement as exc:
            found = (None, exc.group or "", str(exc))
        self.group_cache[uid] = (pod, found)
        return found

    def _scheduler_of(self, pods: list[dict[str, Any]]) -> str:
        """The scheduler the group's oldest (gated) pod asks for. Not the most common one: pods of another
        scheduler made later with the group's labels, however many, must not become the group."""
        oldest = min(pods, key=lambda p: (_created(p), str(p["metadata"].get("name"))))
        return _scheduler(oldest)

    def _gated(self, pod: Mapping[str, Any]) -> bool:
        return pins.gate_index(pod, self.gate) is not None

    def _restore_holds(self) -> None:
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
                    self.held[uid] = node
                    self._feed_cache(uid)

    async def reconcile_all(self) -> None:
        self.passes += 1
        self._restore_holds()
        groups = self.groups()
        keys = {g.spec.key for g in groups}
        for key in [k for k in self.evaluated if k not in keys]:
            del self.evaluated[key]
        # What is kept per group goes with it: owners' counts past their TTL (read again when needed) and
        # deleted PlacementGroups of groups that have no pod left.
        now = self.clock()
        self.sizes = {r: v for r, v in self.sizes.items() if now - v[0] <= SIZE_TTL_S}
        self.lost = {k: v for k, v in self.lost.items() if (v.get("spec") or {}).get("key") in keys}
        for group in groups:
            if not self.leading():
                return  # lost the Lease mid-pass: another replica may be admitting already
            try:
                await self.reconcile(group)
            except ApiException as exc:
                log.warning(
                    "could not reconcile a group; retrying",
                    extra={"group": group.spec.key, "status": exc.status, "error": str(exc.reason)},
                )
        self.metrics.count_phases(
            (pg.get("status") or {}).get("phase", "Pending") for pg in self.pgs.values()
        )

    # --- one group -------------------------------------------------------------------------------

    def _pg(self, spec: GroupSpec) -> tuple[dict[str, Any] | None, PlacementGroupStatus]:
        ns = spec.key.split("/", 1)[0]
        pg = self.pgs.get((ns, model.object_name(spec.key)))
        if pg is None:
            lost = self.lost.get((ns, model.object_name(spec.key)))
            if lost is None or (lost.get("spec") or {}).get("key") != spec.key:
                return None, PlacementGroupStatus()
            # Deleted by someone else: carried on from what we last wrote, and written again (_write).
            with contextlib.suppress(ValueError):
                return None, PlacementGroupStatus.model_validate(lost.get("status") or {})
            return None, PlacementGroupStatus()
        try:
            return pg, PlacementGroupStatus.model_validate(pg.get("status") or {})
        except ValueError:
            # Only we write it; an unreadable status (an older version, a hand edit) starts over.
            log.warning("unreadable PlacementGroup status, starting over", extra={"group": spec.key})
            return pg, PlacementGroupStatus()

    async def reconcile(self, group: GroupView) -> None:
        pg, status = self._pg(group.spec)
        now = self.clock()
        if pg is None and self._gone(group, status):
            return
        if status.phase == "Admitted":
            await self._follow(group, pg, status, now)
            return
        if status.phase == "TimedOut" and status.members:
            await self._evict_left(group, status)  # refused before (a PodDisruptionBudget): again
        gated = [p for p in group.members if self._gated(p)]
        if status.phase == "Bound" and await self._full(group, status, gated):
            await self._refresh_members(group, pg, status)  # extra gated pods wait, unadmitted
            return
        if not gated:
            return
        next_at = _ts(status.next_attempt_time)
        if status.phase == "TimedOut" and next_at is not None and now < next_at:
            return
        seen = self.evaluated.get(group.spec.key)
        if pg is not None and seen is not None and seen[0] == self.generation and now - seen[1] < SIZE_TTL_S:
            return  # nothing changed since this group was last decided
        self.evaluated[group.spec.key] = (self.generation, now)
        size, owner = await self._size(group)
        owned = self._own(group, owner)
        gated = gated if owned is None else owned
        # Only a member's unusable annotation holds the group back: a pod the owner does not control
        # (anyone's, with the owner's label) never does.
        group.invalid = next(
            (group.errors[u] for p in group.members if (u := str(p["metadata"].get("uid"))) in group.errors),
            "",
        )
        if group.invalid:
            await self._write(
                group, pg, self._outcome(status, group, "Waiting", f"InvalidPlacement: {group.invalid}")
            )
            self._events(group, gated, "Warning", "InvalidPlacement", group.invalid)
            return
        members = []
        for p in group.members:
            try:
                needs = pod_needs(p)
            except PodError as exc:
                reason = f"pod {p['metadata'].get('name')}: {exc}"
                await self._write(group, pg, self._outcome(status, group, "Waiting", reason, size=size))
                return
            members.append(
                Member(
                    name=str(p["metadata"].get("name")),
                    uid=str(p["metadata"].get("uid")),
                    needs=needs,
                    gated=self._gated(p),
                    node=str(p["spec"].get("nodeName") or ""),
                    created=_created(p),
                )
            )
        verdict = admit(group.spec, size, members, self.cache, self.config, unschedulable=self.cordoned)
        if verdict.outcome != "admitted":
            phase: Phase = "NeverFits" if verdict.outcome == "never-fits" else "Waiting"
            if size.value is None:
                phase = "Pending"
            new = self._outcome(status, group, phase, verdict.reason, size=size, verdict=verdict)
            changed = await self._write(group, pg, new)
            if changed and new.decision != status.decision:
                kind = "Warning" if phase == "NeverFits" else "Normal"
                reason = "GroupNeverFits" if phase == "NeverFits" else "GroupWaiting"
                self._events(group, gated, kind, reason, verdict.reason, pg_too=True)
                self._annotate(gated, verdict.reason)
            return
        await self._admit(group=group, pg=pg, status=status, size=size, verdict=verdict, now=now)

    async def _full(
        self, group: GroupView, status: PlacementGroupStatus, gated: list[dict[str, Any]]
    ) -> bool:
        """A Bound group with as many pods bound as its size: gated pods are extra and wait."""
        bound = sum(1 for p in group.members if p["spec"].get("nodeName"))
        if not gated:
            return True
        if status.size is None or bound < status.size:
            return False
        # The owner may have grown since (a Job's parallelism raised): its count, read again every
        # SIZE_TTL_S, decides whether the gated pods are extra or new members.
        size, _owner = await self._size(group)
        return size.value is None or bound >= size.value

    def _own(self, group: GroupView, owner: Owner | None) -> list[dict[str, Any]] | None:
        """Narrow the group to its owner's pods; their gated ones (None when no owner was read).

        An owner that was read (a real Job controller sets its reference on every pod it makes): a pod
        it does not control never counts, whatever labels it copied, even before the owner's own pods
        exist (pods made ahead of them with its label would otherwise be admitted as the group)."""
        group.owner = owner
        if owner is None or not owner.uid:
            return None
        controlled = [p for p in group.candidates if controls(owner, p)]
        # The owner's pods, of the scheduler they ask for: pods of any other scheduler carrying the
        # owner's labels, made earlier or more numerous, never pick the group's scheduler.
        if controlled:
            group.scheduler = self._scheduler_of([p for p in controlled if self._gated(p)] or controlled)
        group.members = [p for p in controlled if _scheduler(p) == group.scheduler]
        return [p for p in group.members if self._gated(p)]  # Events and copies go to these only

    def _gone(self, group: GroupView, status: PlacementGroupStatus) -> bool:
        """A deleted PlacementGroup's group gone with its pods (its owner deleted): not written again."""
        if status.phase not in ("Admitted", "TimedOut"):
            return False
        live = {str(p["metadata"].get("uid")) for p in group.candidates}
        if any(m.uid in live for m in status.members) or any(self._gated(p) for p in group.members):
            return False
        ns = group.spec.key.split("/", 1)[0]
        self.lost.pop((ns, model.object_name(group.spec.key)), None)
        return True

    def _outcome(
        self,
        status: PlacementGroupStatus,
        group: GroupView,
        phase: Phase,
        text: str,
        *,
        size: Size | None = None,
        verdict: Verdict | None = None,
    ) -> PlacementGroupStatus:
        new = status.model_copy(deep=True)
        new.phase = phase
        new.decision = text
        if size is not None:
            new.size, new.size_source = size.value, size.source
        spec = group.spec
        new.locality, new.rank = spec.locality, spec.rank
        if spec.homogeneous_keys is not None:
            new.homogeneous_keys = list(spec.homogeneous_keys)
        new.members = [
            model.Member(pod=str(p["metadata"].get("name")), uid=str(p["metadata"].get("uid")))
            for p in sorted(group.members, key=lambda p: str(p["metadata"].get("name")))
        ]
        new.level = verdict.decision.level if verdict and verdict.decision else ""
        new.location, new.homogeneity = "", {}
        now = _now_dt(self.clock())
        reason = {"Pending": "SizeUnknown", "Waiting": "Waiting", "NeverFits": "NeverFits"}.get(phase, phase)
        new.conditions = model.set_condition(
            new.conditions, "Admitted", status="False", reason=reason, message=text[:1024], now=now
        )
        return new

    async def _size(self, group: GroupView) -> tuple[Size, Owner | None]:
        spec = group.spec
        declared: list[tuple[int | None, str]] = []
        for p in group.members:
            try:
                s = group_of(p, self.config)
            except InvalidPlacement:
                s = None
            declared.append((s.size if s else None, str(p["metadata"].get("name"))))
        ref = owner_ref(spec, group.members[0]) if group.members else None
        owner: Owner | None = None
        if ref is not None:
            cached = self.sizes.get(ref)
            now = self.clock()
            if cached is None or now - cached[0] > SIZE_TTL_S:
                cached = self.sizes[ref] = (now, await asyncio.to_thread(self.owners.read, ref))
            owner = cached[1]
        if owner is None:
            return resolve(None, "", declared), None
        return resolve(owner.count, owner.problem, declared), owner

    async def _admit(
        self,
        *,
        group: GroupView,
        pg: dict[str, Any] | None,
        status: PlacementGroupStatus,
        size: Size,
        verdict: Verdict,
        now: float,
    ) -> None:
        decision = verdict.decision
        assert decision is not None
        choice = decision.choice
        new = self._outcome(status, group, "Admitted", verdict.reason, size=size, verdict=verdict)
        new.members = [
            model.Member(
                pod=str(p["metadata"].get("name")),
                uid=str(p["metadata"].get("uid")),
                node=verdict.assignments.get(
                    str(p["metadata"].get("name")), str(p["spec"].get("nodeName") or "")
                ),
                bound=bool(p["spec"].get("nodeName")),
                ready=_ready(p),
            )
            for p in sorted(group.members, key=lambda p: str(p["metadata"].get("name")))
            # The group is its bound pods and those given a node; extra gated pods stay out, gated.
            if p["spec"].get("nodeName") or str(p["metadata"].get("name")) in verdict.assignments
        ]
        if choice is not None:
            new.level = choice.level
            new.location = choice.location or ""
            new.homogeneity = dict(choice.homogeneity)
        new.admitted_time = _now_dt(now)
        new.next_attempt_time = None
        new.attempts = status.attempts + 1
        at = new.admitted_time
        new.conditions = model.set_condition(
            new.conditions,
            "Admitted",
            status="True",
            reason="Admitted",
            message=verdict.reason[:1024],
            now=at,
        )
        new.conditions = model.set_condition(
            new.conditions,
            "AllBound",
            status="False",
            reason="Binding",
            message="waiting for binding",
            now=at,
        )
        if new.condition("TimedOut") is not None:
            new.conditions = model.set_condition(
                new.conditions, "TimedOut", status="False", reason="Readmitted", message="", now=at
            )
        # The status first: a restart from here on carries on from it.
        await self._write(group, pg, new)
        for m in new.members:
            if m.node and not m.bound:
                self.held[m.uid] = m.node
                self._feed_cache(m.uid)
        log.info(
            "group admitted",
            extra={
                "group": group.spec.key,
                "size": size.value,
                "attempt": new.attempts,
                "decision": verdict.reason,
            },
        )
        gated = [p for p in group.members if self._gated(p)]
        self._events(group, gated, "Normal", "GroupAdmitted", verdict.reason, pg_too=True)
        self._annotate(gated, verdict.reason)
        if await self._release(group, new):
            last = max((_created(p) for p in group.members), default=now)
            self.metrics.admission.observe(max(0.0, self.clock() - last))

    async def _release(self, group: GroupView, status: PlacementGroupStatus) -> bool:
        """Pin each assigned, still gated member to its node and remove our gate. True when all went."""
        by_uid = {str(p["metadata"].get("uid")): p for p in group.members}
        ok = True
        for m in status.members:
            pod = by_uid.get(m.uid)
            if pod is None or not m.node or not self._gated(pod):
                continue
            ns, name = str(pod["metadata"].get("namespace")), m.pod
            try:
                for patch in (pins.pin_patch(pod, m.node), pins.ungate_patch(pod, self.gate)):
                    if patch is None:
                        continue
                    resp = await asyncio.to_thread(
                        self.core.patch_namespaced_pod,
                        name,
                        ns,
                        patch,
                        _content_type="application/json-patch+json",
                        _preload_content=False,
                    )
                    # What we wrote is what the next pass reads, though the watch has not shown it yet: a
                    # second pin of a pod ungated since would be refused.
                    self._upsert_pod(json.loads(resp.data))
                    pod = self.pods[m.uid]
            except ApiException as exc:
                ok = False
                # 404: gone (the owner makes another); 422/409: changed under us, next pass reads it again.
                log.warning(
                    "could not release an admitted pod",
                    extra={
                        "pod": f"{ns}/{name}",
                        "node": m.node,
                        "status": exc.status,
                        "error": str(exc.reason),
                    },
                )
        return ok

    async def _follow(
        self, group: GroupView, pg: dict[str, Any] | None, status: PlacementGroupStatus, now: float
    ) -> None:
        """An admitted group: release what is still gated, record binding and readiness, time out."""
        for m in status.members:
            # After a restart the status is the state: its unbound members hold their nodes again.
            pod = self.pods.get(m.uid)
            if (
                m.node
                and pod is not None
                and not pod["spec"].get("nodeName")
                and self.held.get(m.uid) != m.node
            ):
                self.held[m.uid] = m.node
                self._feed_cache(m.uid)
        still_gated = any(
            m.node and m.uid in self.pods and self._gated(self.pods[m.uid]) for m in status.members
        )
        released = await self._release(group, status)
        new = self._with_flags(status)
        if still_gated and released:
            # Gates this process had to remove (a restart mid-admission, a patch refused once): the pods
            # could not bind before, through no fault of the group's, so its clock starts now.
            new.admitted_time = _now_dt(now)
        everyone = bool(new.members) and all(m.bound and m.ready for m in new.members)
        at = _now_dt(now)
        if everyone:
            new.phase = "Bound"
            new.conditions = model.set_condition(
                new.conditions, "AllBound", status="True", reason="AllBoundAndReady", message="", now=at
            )
            for m in new.members:
                self.held.pop(m.uid, None)
            await self._write(group, pg, new)
            return
        admitted = _ts(new.admitted_time) or now
        if now - admitted <= self.config.group_ready_timeout_seconds:
            await self._write(group, pg, new)
            return
        await self._time_out(group, pg, new, now)

    def _with_flags(self, status: PlacementGroupStatus) -> PlacementGroupStatus:
        new = status.model_copy(deep=True)
        for m in new.members:
            pod = self.pods.get(m.uid)
            m.bound = bool(pod and pod["spec"].get("nodeName"))
            m.ready = bool(pod and _ready(pod))
        return new

    async def _refresh_members(
        self, group: GroupView, pg: dict[str, Any] | None, status: PlacementGroupStatus
    ) -> None:
        await self._write(group, pg, self._with_flags(status))

    async def _time_out(
        self, group: GroupView, pg: dict[str, Any] | None, status: PlacementGroupStatus, now: float
    ) -> None:
        missing = [m.pod for m in status.members if not (m.bound and m.ready)]
        timeout = self.config.group_ready_timeout_seconds
        reason = (
            f"group {group.spec.key} was not bound and Ready within {timeout:g}s of its admission "
            f"({len(missing)} of {len(status.members)} not: {', '.join(missing[:8])}); its pods are evicted "
            "and the group is admitted afresh"
        )
        backoff = backoff_s(status.attempts, self.backoff_base)
        at = _now_dt(now)
        new = status.model_copy(deep=True)
        new.phase = "TimedOut"
        new.decision = reason
        new.next_attempt_time = _now_dt(now + backoff) if backoff >= 1 else at + timedelta(seconds=backoff)
        new.conditions = model.set_condition(
            new.conditions, "TimedOut", status="True", reason="GroupTimedOut", message=reason[:1024], now=at
        )
        new.conditions = model.set_condition(
            new.conditions, "Admitted", status="False", reason="GroupTimedOut", message=reason[:1024], now=at
        )
        new.conditions = model.set_condition(
            new.conditions, "AllBound", status="False", reason="GroupTimedOut", message="", now=at
        )
        evict = [m for m in status.members if m.uid in self.pods]
        # The members still listed while timed out are the pods still to evict (the reason is recorded
        # before anything is evicted); those a PodDisruptionBudget keeps are tried again on later passes.
        new.members = evict
        await self._write(group, pg, new)
        log.warning("group timed out, evicting its pods", extra={"group": group.spec.key, "pods": len(evict)})
        pods = [self.pods[m.uid] for m in evict]
        self._events(group, pods, "Warning", "GroupTimedOut", reason, pg_too=True)
        for m in evict:
            self.held.pop(m.uid, None)
            self._feed_cache(m.uid)
        await self._evict_left(group, new)

    async def _evict_left(self, group: GroupView, status: PlacementGroupStatus) -> None:
        """Evict the timed-out group's pods still listed; keep listed only those still refused."""
        left = []
        for m in status.members:
            pod = self.pods.get(m.uid)
            if pod is None or pod["metadata"].get("deletionTimestamp"):
                continue
            if not await self._evict(pod):
                left.append(m)
        if left != status.members:
            new = status.model_copy(deep=True)
            new.members = left
            await self._write(group, self._pg(group.spec)[0], new)

    async def _evict(self, pod: Mapping[str, Any]) -> bool:
        """Evict (or, where eviction is not served, delete) the pod. False when it was refused for now."""
        meta = pod["metadata"]
        ns, name, uid = str(meta.get("namespace")), str(meta.get("name")), meta.get("uid")
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": ns},
            "deleteOptions": {"preconditions": {"uid": uid}},
        }
        try:
            await asyncio.to_thread(self.core.create_namespaced_pod_eviction, name, ns, body)
            self.metrics.evictions.inc()
            return True
        except ApiException as exc:
            if exc.status != 404 or _names_object(exc, name):
                if exc.status != 404:  # 429: a PodDisruptionBudget says not now; the next pass tries again
                    log.warning(
                        "could not evict a pod of a timed-out group",
                        extra={"pod": f"{ns}/{name}", "status": exc.status, "error": str(exc.reason)},
                    )
                    return False
                return True
        # A 404 naming no pod: this API server does not serve pods/eviction. Delete, on the same uid.
        log.warning("pods/eviction is not served; deleting instead", extra={"pod": f"{ns}/{name}"})
        try:
            await asyncio.to_thread(
                self.core.delete_namespaced_pod, name, ns, body={"preconditions": {"uid": uid}}
            )
            self.metrics.evictions.inc()
        except ApiException as exc:
            if exc.status not in (404, 409):
                log.warning(
                    "could not delete a pod of a timed-out group",
                    extra={"pod": f"{ns}/{name}", "status": exc.status, "error": str(exc.reason)},
                )
                return False
        return True

    # --- writes ----------------------------------------------------------------------------------

    async def _write(self, group: GroupView, pg: dict[str, Any] | None, status: PlacementGroupStatus) -> bool:
        """Create the PlacementGroup when missing and write its status when it changed. True when written."""
        spec = group.spec
        ns = spec.key.split("/", 1)[0]
        name = model.object_name(spec.key)
        body_status = status.model_dump(by_alias=True, mode="json")
        if pg is not None and (pg.get("status") or {}) == body_status:
            return False
        if pg is None:
            meta: dict[str, Any] = {
                "name": name,
                "namespace": ns,
                "labels": {**model.MANAGED_BY, model.FAMILY_LABEL: spec.family},
            }
            owner = group.owner
            lost = self.lost.get((ns, name))
            refs = (lost.get("metadata") or {}).get("ownerReferences") if lost is not None else None
            if owner is None and isinstance(refs, list) and refs:
                meta["ownerReferences"] = refs  # written again as it was: still goes with its owner
            elif owner is not None and owner.uid:
                # Garbage-collected with the Job (JobSet, ...) it describes.
                meta["ownerReferences"] = [
                    {
                        "apiVersion": owner.api_version,
                        "kind": owner.ref.kind,
                        "name": owner.ref.name,
                        "uid": owner.uid,
                    }
                ]
            obj = model.PlacementGroup(
                metadata=meta,
                spec=model.PlacementGroupSpec(key=spec.key, family=spec.family, name=spec.name),
            ).model_dump(by_alias=True, mode="json", exclude={"status"})
            try:
                pg = await asyncio.to_thread(
                    self.custom.create_namespaced_custom_object,
                    model.GROUP,
                    model.VERSION,
                    ns,
                    model.PLURAL,
                    obj,
                )
            except ApiException as exc:
                if exc.status != 409:
                    raise
                pg = await asyncio.to_thread(
                    self.custom.get_namespaced_custom_object,
                    model.GROUP,
                    model.VERSION,
                    ns,
                    model.PLURAL,
                    name,
                )
            assert pg is not None
            self._apply_pg("ADDED", pg)
            if (pg.get("status") or {}) == body_status:
                return False
        patch = [{"op": "add", "path": "/status", "value": body_status}]
        written = await asyncio.to_thread(
            self.custom.patch_namespaced_custom_object_status,
            model.GROUP,
            model.VERSION,
            ns,
            model.PLURAL,
            name,
            patch,
            _content_type="application/json-patch+json",
        )
        self._apply_pg("MODIFIED", written)
        return True

    def _events(
        self,
        group: GroupView,
        pods: list[dict[str, Any]],
        type_: str,
        reason: str,
        message: str,
        *,
        pg_too: bool = False,
    ) -> None:
        targets: list[Mapping[str, Any]] = list(pods)
        if pg_too:
            ns = group.spec.key.split("/", 1)[0]
            pg = self.pgs.get((ns, model.object_name(group.spec.key)))
            if pg is not None:
                targets.append(pg)
        for obj in targets:  # the publisher's spam filter holds back a burst about one object
            self.publisher.event(obj, type_, reason, message)

    def _annotate(self, pods: list[dict[str, Any]], text: str) -> None:
        """The decision copied onto each pod for `kubectl describe pod`; never read back."""
        for pod in pods:
            uid = str(pod["metadata"].get("uid"))
            if self.annotated.get(uid) == text:
                continue
            self.annotated[uid] = text
            self.publisher.annotate(pod, {self.decision_key: text[:4096]})


def backoff_s(attempts: int, base: float = BACKOFF_BASE_S) -> float:
    """Seconds before a timed-out group is admitted again: doubling per admission, capped. The exponent
    is bounded first: `attempts` is read back from the PlacementGroup, and 2 ** (a huge count) would take
    the process's memory and time before the cap applied."""
    return Backoff(base, BACKOFF_CAP_S, jitter=False).delay(attempts - 1)


def _names_object(exc: ApiException, name: str) -> bool:
    """A 404 Status about the object itself (its details name it), not about a path the server lacks."""
    try:
        details = json.loads(exc.body or "{}").get("details") or {}
    except (ValueError, AttributeError):
        return False
    return isinstance(details, dict) and details.get("name") == name


def _scheduler(pod: Mapping[str, Any]) -> str:
    return str(pod["spec"].get("schedulerName") or "default-scheduler")


def _rv(obj: Mapping[str, Any]) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0
