"""Which pods make which group, and how large each group is meant to be.

Pods are grouped by the key their annotations and labels name (group_of); a group's members are its live
pods of the scheduler its oldest gated pod asks for, narrowed to its owner's pods once the owner is read
(a real Job controller sets its reference on every pod it makes; a JobSet's or LeaderWorkerSet's pods are
held to the chain of controllers up to it, chain.py). The expected size comes from the owner
(read again after SIZE_TTL_S while the group waits) or what the pods declare (owners.resolve).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from nodefabric_operator.admission import podview
from nodefabric_operator.admission.chain import ChainReader, Membership, membership
from nodefabric_operator.admission.model import PlacementGroupStatus
from nodefabric_operator.admission.owners import (
    CHAINED,
    Owner,
    OwnerFetcher,
    OwnerRef,
    Size,
    owner_ref,
    resolve,
)
from nodefabric_operator.admission.state import CLAIMING, Tables, pg_key
from nodefabric_operator.extender.cache import TERMINAL
from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.extender.groups import GroupSpec, InvalidPlacement, group_of

SIZE_TTL_S = 5.0  # an owner's count is read again after this long while its group waits


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
    # Pods of its scheduler not counted yet, with why: their chain up to the owner could not be read.
    pending: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    # Of those, the uids of the ones whose reason is final (what they name is not found): never told.
    untold: set[str] = field(default_factory=set)


def scheduler_of(pods: list[dict[str, Any]]) -> str:
    """The scheduler the group's oldest (gated) pod asks for. Not the most common one: pods of another
    scheduler made later with the group's labels, however many, must not become the group."""
    oldest = min(pods, key=lambda p: (podview.created(p), podview.name(p)))
    return podview.scheduler(oldest)


class Grouping:
    def __init__(
        self,
        config: ExtenderConfig,
        api: client.ApiClient,
        tables: Tables,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.tables = tables
        self.clock = clock
        self.owners = OwnerFetcher(api)
        self.chain = ChainReader(api, clock, retry_s=SIZE_TTL_S)
        self.sizes: dict[OwnerRef, tuple[float, Owner]] = {}
        self.group_cache: dict[str, tuple[dict[str, Any], tuple[GroupSpec | None, str, str]]] = {}
        # Gated pods of no group groups() found (with why their group cannot be read, "" when they name
        # none): nothing would ever remove their gate.
        self.ungrouped: list[tuple[dict[str, Any], str]] = []
        # Pods an admission holds whose labels name another group since, or none: (pod, the key they
        # name, "" for none, the key of the group that holds them).
        self.relabelled: list[tuple[dict[str, Any], str, str]] = []
        tables.per_pod.append(self.group_cache)

    def groups(self) -> list[GroupView]:
        """Every group with a gated pod or a PlacementGroup to follow, oldest first."""
        gated_of = self.tables.gated
        by_key: dict[str, list[tuple[GroupSpec | None, dict[str, Any], str]]] = {}
        specs: dict[str, GroupSpec] = {}
        self.ungrouped = []
        self.relabelled = []
        claims = self.tables.claims()
        for uid, pod in self.tables.pods.items():
            spec, key, error = self._group_of(uid, pod)
            held_by = claims.get(uid)
            if held_by is not None and held_by != key:
                # Admitted as a member of another group, then relabelled: still that group's, and never
                # counted by the group its labels name now (nor an InvalidPlacement of its own).
                by_key.setdefault(held_by, []).append((None, pod, ""))
                self.relabelled.append((pod, key, held_by))
                continue
            if error:
                if key and gated_of(pod):
                    by_key.setdefault(key, []).append((None, pod, error))
                elif gated_of(pod):
                    self.ungrouped.append((pod, error))
                continue
            if spec is None:
                if gated_of(pod):
                    self.ungrouped.append((pod, ""))
                continue
            specs.setdefault(spec.key, spec)
            by_key.setdefault(spec.key, []).append((spec, pod, ""))
        followed = self.tables.followed()
        out = []
        for key, entries in by_key.items():
            pods = [p for _, p, _ in entries]
            gated = [p for p in pods if gated_of(p)]
            if not gated and key not in followed:
                continue
            errors = {podview.uid(p): err for _, p, err in entries if err}
            spec = specs.get(key)
            if spec is None:
                _ns, family, name = ([*key.split("/", 2), "", ""])[:3]
                spec = GroupSpec(key, family, name, None, "prefer", "spread", None)
            live = [
                p
                for p in pods
                if (p["status"].get("phase") not in TERMINAL) and not p["metadata"].get("deletionTimestamp")
            ]
            scheduler = scheduler_of(gated or pods)
            members = [p for p in live if podview.scheduler(p) == scheduler]
            out.append(GroupView(spec, scheduler, members, candidates=live, errors=errors))
        out.sort(key=lambda g: (min((podview.created(p) for p in g.members), default=0.0), g.spec.key))
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

    def forget_stale(self, now: float, keys: set[str]) -> None:
        """What is kept per group goes with it: owners' counts past their TTL (read again when needed) and
        deleted PlacementGroups of groups that have no pod left."""
        self.sizes = {r: v for r, v in self.sizes.items() if now - v[0] <= SIZE_TTL_S}
        self.tables.lost = {
            k: v for k, v in self.tables.lost.items() if (v.get("spec") or {}).get("key") in keys
        }

    def memberships(self, group: GroupView, owner: Owner | None) -> dict[str, Membership]:
        """Each live pod's membership, by uid, from what was read of its chain (size reads it)."""
        pods = self.tables.pods
        return {podview.uid(p): membership(owner, p, self.chain.lookup, pods) for p in group.candidates}

    def chain_state(self, group: GroupView, owner: Owner | None) -> tuple[tuple[str, Membership], ...]:
        """What the chains say, as it bears on the decision: a chain read again (a refusal lifted) may
        count a pod that was not, with nothing else changed. Empty for owners that need no chain."""
        if owner is None or not owner.uid or owner.ref.kind not in CHAINED:
            return ()
        return tuple(sorted(self.memberships(group, owner).items()))

    def own(self, group: GroupView, owner: Owner | None) -> list[dict[str, Any]] | None:
        """Narrow the group to its owner's pods; their gated ones (None when no owner was read).

        An owner that was read (a real Job controller sets its reference on every pod it makes): a pod
        it does not control never counts, whatever labels it copied, even before the owner's own pods
        exist (pods made ahead of them with its label would otherwise be admitted as the group). For a
        JobSet or LeaderWorkerSet, the pod's chain of controllers must lead to it, by uid; a pod whose
        chain could not be read is not counted yet, and said in `group.pending`."""
        group.owner = owner
        group.pending, group.untold = [], set()
        if owner is None or not owner.uid:
            return None
        verdicts = self.memberships(group, owner)
        controlled = [p for p in group.candidates if verdicts[podview.uid(p)].member]
        # The owner's pods, of the scheduler they ask for: pods of any other scheduler carrying the
        # owner's labels, made earlier or more numerous, never pick the group's scheduler.
        if controlled:
            group.scheduler = scheduler_of([p for p in controlled if self.tables.gated(p)] or controlled)
        group.members = [p for p in controlled if podview.scheduler(p) == group.scheduler]
        group.pending = [
            (p, why)
            for p in group.candidates
            if (why := verdicts[podview.uid(p)].reason) and podview.scheduler(p) == group.scheduler
        ]
        group.untold = {podview.uid(p) for p, _ in group.pending if verdicts[podview.uid(p)].settled}
        return [p for p in group.members if self.tables.gated(p)]  # Events and copies go to these only

    def vouch(self, group: GroupView, status: PlacementGroupStatus) -> None:
        """A group no owner vouches for (named by labels alone, which anyone who can create a pod can
        copy): a bound pod counts as a member only when its node was given by this group's admission
        (its PlacementGroup lists it on one). Any other bound pod carrying the group's labels occupies
        its node like every pod, but never makes the group partly admitted: it would take a real
        member's place, leaving that one gated as extra, and pull the group to its node."""
        if group.owner is not None and group.owner.uid:
            return
        given = {m.uid for m in status.members if m.node}
        group.members = [p for p in group.members if not p["spec"].get("nodeName") or podview.uid(p) in given]

    async def size(self, group: GroupView) -> tuple[Size, Owner | None]:
        spec = group.spec
        declared: list[tuple[int | None, str]] = []
        for p in group.members:
            try:
                s = group_of(p, self.config)
            except InvalidPlacement:
                s = None
            declared.append((s.size if s else None, podview.name(p)))
        ref = owner_ref(spec, group.members[0]) if group.members else None
        owner = await self._owner(ref) if ref is not None else None
        if owner is not None and owner.uid and owner.ref.kind in CHAINED:
            # Each object of the pods' chains read once (a failed read again after SIZE_TTL_S).
            await self.chain.resolve(owner, group.candidates, self.tables.pods)
        if owner is None:
            return resolve(None, "", declared), None
        return resolve(owner.count, owner.problem, declared), owner

    async def _owner(self, ref: OwnerRef, *, fresh: bool = False) -> Owner:
        """The owner as read, again once SIZE_TTL_S passed (or now, `fresh`)."""
        cached = self.sizes.get(ref)
        now = self.clock()
        if fresh or cached is None or now - cached[0] > SIZE_TTL_S:
            cached = self.sizes[ref] = (now, await asyncio.to_thread(self.owners.read, ref))
        return cached[1]

    async def full(self, group: GroupView, status: PlacementGroupStatus, gated: list[dict[str, Any]]) -> bool:
        """A Bound group with as many of its own pods bound as its size: gated pods are extra and wait.
        Its pods narrowed first, as for a decision (`own`, `vouch`): a pod bound by hand with the owner's
        label, that the owner does not vouch for, takes no member's place (the group's own pod, gated
        to replace one gone, would wait as extra for ever), and a gated one of nobody's is not the
        group's to admit."""
        if not gated:
            return True
        # The owner may have grown since (a Job's parallelism raised): its count, read again every
        # SIZE_TTL_S, decides whether the gated pods are extra or new members.
        size, owner = await self.size(group)
        owned = self.own(group, owner)
        self.vouch(group, status)
        if owned is not None and not owned:
            return True
        bound = sum(1 for p in group.members if p["spec"].get("nodeName"))
        if status.size is None or bound < status.size:
            return False
        return size.value is None or bound >= size.value

    async def gone(self, group: GroupView, status: PlacementGroupStatus) -> bool:
        """A deleted PlacementGroup's group gone with its pods or with its owner: not written again.

        Garbage collection deletes the PlacementGroup with the owner it names (its ownerReference), and
        the owner's pods maybe only after: written again for them, it would name an owner that is gone
        and be collected again. So a group whose owner is not found (or is another object now, made
        again under its name) is let go with it; one whose owner could not be read is written again."""
        if status.phase not in CLAIMING:
            return False
        live = {podview.uid(p) for p in group.candidates}
        pods = any(m.uid in live for m in status.members) or any(self.tables.gated(p) for p in group.members)
        if pods and not await self._owner_gone(group):
            return False
        self.tables.lost.pop(pg_key(group.spec), None)
        return True

    async def _owner_gone(self, group: GroupView) -> bool:
        lost = self.tables.lost.get(pg_key(group.spec)) or {}
        refs = (lost.get("metadata") or {}).get("ownerReferences")
        uids = {r.get("uid") for r in refs if isinstance(r, dict)} if isinstance(refs, list) else set()
        pods = group.members or group.candidates
        ref = owner_ref(group.spec, pods[0]) if pods else None
        if ref is None or not uids - {None, ""}:
            return False  # written for no owner (a group named by labels alone): written again
        owner = await self._owner(ref, fresh=True)  # a count kept from before the deletion says nothing
        if owner.uid:
            return owner.uid not in uids
        return owner.problem.endswith(" not found")
