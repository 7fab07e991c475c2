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

The controller is the loop and the decision for one group; what it decides with and writes through lives
beside it: state (the watched tables and held nodes), grouping (members and expected size), transitions
(the status each decision yields, pure), writer (PlacementGroup, Events, decision copies), release (pin
and ungate) and eviction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from nodefabric_devicemanager import vocabulary
from nodefabric_devicemanager.backoff import Backoff
from nodefabric_operator.admission import fresh, podview, transitions
from nodefabric_operator.admission.admit import Member, Verdict, admit
from nodefabric_operator.admission.eviction import Evictor
from nodefabric_operator.admission.grouping import Grouping, GroupView
from nodefabric_operator.admission.metrics import PlacementMetrics
from nodefabric_operator.admission.model import Phase, PlacementGroupStatus
from nodefabric_operator.admission.owners import Owner, Size
from nodefabric_operator.admission.release import Releaser
from nodefabric_operator.admission.state import Tables, owns
from nodefabric_operator.admission.transitions import now_dt, ts
from nodefabric_operator.admission.writer import PlacementWriter
from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.extender.events import KubePublisher
from nodefabric_operator.extender.pods import PodError, pod_needs
from nodefabric_operator.extender.watch import Watcher

log = logging.getLogger(__name__)

COMPONENT = "nodefabric-placement"
BACKOFF_BASE_S = 5.0
BACKOFF_CAP_S = 300.0
TICK_S = 1.0  # timeouts and backoffs are looked at this often even when nothing changes
# (connect, read) seconds for each write of the loop: a reply that never comes (an API server behind a
# network that drops it) would otherwise hold the loop for ever, while the Lease, renewed on its own,
# keeps every other replica from admitting.
WRITE_TIMEOUT = (5.0, 30.0)


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
        write_timeout: tuple[float, float] = WRITE_TIMEOUT,
        every_event: bool = False,
    ) -> None:
        self.config = config
        self.metrics = metrics or PlacementMetrics()
        self.clock = clock
        self.leading = leading
        self.backoff_base = backoff_base
        self.core: Any = client.CoreV1Api(api)  # takes plain dicts as readily as its models
        self.custom: Any = client.CustomObjectsApi(api)
        self.tables = Tables(config)
        self.cache = self.tables.cache
        self.wake = self.tables.wake  # set by every watch event, and by whoever stops the loop
        self.grouping = Grouping(config, api, self.tables, clock)
        self.publisher = KubePublisher(
            self.core,
            self.metrics.registry,
            component=COMPONENT,
            metric="nodefabric_placement_writes_failed",
            clock=clock,  # the spam filter runs on the controller's clock
        )
        decision_key = vocabulary.placement_key(vocabulary.DECISION, config.domain)
        self.writer = PlacementWriter(
            self.custom, self.tables, self.publisher, decision_key, clock, timeout=write_timeout
        )
        self.releaser = Releaser(self.core, self.tables, timeout=write_timeout)
        self.evictor = Evictor(self.core, self.tables, self.writer, self.metrics, timeout=write_timeout)
        # Each group's inputs at its last decision; every_event: the former rule, for comparison.
        self.fresh = fresh.Fresh(self.tables, self.grouping, leading, every_event=every_event)
        self.watcher = Watcher(self.cache, None, api, feeds=self.tables.feeds(self.core, self.custom))
        self.passes = 0

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

    async def reconcile_all(self) -> None:
        self.passes += 1
        self.tables.restore_holds()
        groups = self.grouping.groups()
        self.writer.tell_ungrouped(self.grouping.ungrouped)
        self.writer.tell_relabelled(self.grouping.relabelled)
        self.writer.flush()
        keys = {g.spec.key for g in groups}
        self.fresh.keep(keys)
        self.grouping.forget_stale(self.clock(), keys)
        for group in groups:
            if not self.leading():
                return  # lost the Lease mid-pass: another replica may be admitting already
            try:
                await self.reconcile(group)
            except (ApiException, HTTPError) as exc:
                # HTTPError: no answer in time, or no connection; the next groups are still reconciled.
                log.warning(
                    "could not reconcile a group; retrying",
                    extra={
                        "group": group.spec.key,
                        "status": getattr(exc, "status", None),
                        "error": str(getattr(exc, "reason", None) or exc),
                    },
                )
        self.metrics.count_phases(
            (pg.get("status") or {}).get("phase", "Pending") for pg in self.tables.pgs.values()
        )

    # --- one group -------------------------------------------------------------------------------

    async def reconcile(self, group: GroupView) -> None:
        pg, status = self.tables.pg(group.spec)
        if await self._left_alone(group, pg, status):
            return
        now = self.clock()
        if status.phase == "Admitted":
            await self._follow(group, pg, status, now)
            return
        if status.phase == "TimedOut" and status.members:
            await self.evictor.evict_left(group, status)  # refused before (a PodDisruptionBudget): again
        gated = [p for p in group.members if self.tables.gated(p)]
        if status.phase == "Bound" and await self.grouping.full(group, status, gated):
            # Extra gated pods wait, unadmitted.
            await self.writer.write(group, pg, transitions.with_flags(status, self.tables.pods))
            return
        if not gated:
            return
        next_at = ts(status.next_attempt_time)
        if status.phase == "TimedOut" and next_at is not None and now < next_at:
            return
        try:
            sizing = await self.fresh.changed(group, pg, status, now)
            if sizing is not None:
                await self._decide(group, pg, status=status, gated=gated, sizing=sizing, now=now)
        except BaseException:
            # Its owner not read or its decision not written (an API error, no answer in time): none of its
            # inputs changed since, yet it must be decided again, or a group that fits would wait for an
            # unrelated change.
            self.fresh.forget(group.spec.key)
            raise

    async def _decide(
        self,
        group: GroupView,
        pg: dict[str, Any] | None,
        *,
        status: PlacementGroupStatus,
        gated: list[dict[str, Any]],
        sizing: tuple[Size, Owner | None],
        now: float,
    ) -> None:
        size, owner = sizing
        owned = self.grouping.own(group, owner)
        self.grouping.vouch(group, status)
        gated = gated if owned is None else owned
        # Only a member's unusable annotation holds the group back: a pod the owner does not control
        # (anyone's, with the owner's label) never does.
        group.invalid = next(
            (group.errors[u] for p in group.members if (u := podview.uid(p)) in group.errors), ""
        )
        if group.invalid:
            text = f"InvalidPlacement: {group.invalid}"
            new = transitions.decided(status, group, "Waiting", text, now_dt(self.clock()))
            await self.writer.write(group, pg, new)
            self.writer.events(group, gated, "Warning", "InvalidPlacement", group.invalid)
            return
        members = []
        for p in group.members:
            try:
                needs = pod_needs(p)
            except PodError as exc:
                reason = f"pod {p['metadata'].get('name')}: {exc}"
                new = transitions.decided(status, group, "Waiting", reason, now_dt(self.clock()), size=size)
                await self.writer.write(group, pg, new)
                return
            members.append(
                Member(
                    name=podview.name(p),
                    uid=podview.uid(p),
                    needs=needs,
                    gated=self.tables.gated(p),
                    node=str(p["spec"].get("nodeName") or ""),
                    created=podview.created(p),
                )
            )
        self.metrics.decisions.inc()
        verdict = admit(
            group.spec, size, members, self.cache, self.config, unschedulable=self.tables.cordoned
        )
        if verdict.outcome == "admitted":
            await self._admit(group=group, pg=pg, status=status, size=size, verdict=verdict, now=now)
            return
        phase: Phase = "NeverFits" if verdict.outcome == "never-fits" else "Waiting"
        if size.value is None:
            phase = "Pending"
        at = now_dt(self.clock())
        # Pods whose chain up to the owner could not be read are not counted; the group says why.
        text = verdict.reason + pending_note(group.pending)
        new = transitions.decided(status, group, phase, text, at, size=size, verdict=verdict)
        changed = await self.writer.write(group, pg, new)
        if changed and new.decision != status.decision:
            kind = "Warning" if phase == "NeverFits" else "Normal"
            reason = "GroupNeverFits" if phase == "NeverFits" else "GroupWaiting"
            # Not those naming an object not found: forged by the thousand, each told every decision.
            told = gated + [
                p for p, _ in group.pending if self.tables.gated(p) and podview.uid(p) not in group.untold
            ]
            self.writer.tell(group, told, kind, reason, text)

    async def _left_alone(
        self, group: GroupView, pg: dict[str, Any] | None, status: PlacementGroupStatus
    ) -> bool:
        """A group gone with its owner, or one whose PlacementGroup is another group's: nothing to do."""
        if pg is None:
            return await self.grouping.gone(group, status)
        if owns(pg, group.spec.key):
            return False
        self.writer.name_taken(group, pg)
        return True

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
        new = transitions.admitted(status, group, size, verdict, now)
        # The status first: a restart from here on carries on from it (and so does the next leader's
        # _follow, should the Lease lapse during the write: no gate is removed without it).
        await self.writer.write(group, pg, new)
        if not self.leading():
            return
        for m in new.members:
            if m.node and not m.bound:
                self.tables.hold(m.uid, m.node)
        log.info(
            "group admitted",
            extra={
                "group": group.spec.key,
                "size": size.value,
                "attempt": new.attempts,
                "decision": verdict.reason,
            },
        )
        gated = [p for p in group.members if self.tables.gated(p)]
        self.writer.events(group, gated, "Normal", "GroupAdmitted", verdict.reason, pg_too=True)
        self.writer.annotate(gated, verdict.reason)
        if await self.releaser.release(group, new):
            last = max((podview.created(p) for p in group.members), default=now)
            self.metrics.admission.observe(max(0.0, self.clock() - last))

    async def _follow(
        self, group: GroupView, pg: dict[str, Any] | None, status: PlacementGroupStatus, now: float
    ) -> None:
        """An admitted group: release what is still gated, record binding and readiness, time out."""
        pods = self.tables.pods
        for m in status.members:
            # After a restart the status is the state: its unbound members hold their nodes again.
            pod = pods.get(m.uid)
            if (
                m.node
                and pod is not None
                and not pod["spec"].get("nodeName")
                and self.tables.held.get(m.uid) != m.node
            ):
                self.tables.hold(m.uid, m.node)
        still_gated = any(m.node and m.uid in pods and self.tables.gated(pods[m.uid]) for m in status.members)
        released = await self.releaser.release(group, status)
        new = transitions.with_flags(status, self.tables.pods)
        if still_gated and released:
            # Gates this process had to remove (a restart mid-admission, a patch refused once): the pods
            # could not bind before, through no fault of the group's, so its clock starts now.
            new.admitted_time = now_dt(now)
        if transitions.everyone_ready(new):
            for m in new.members:
                self.tables.held.pop(m.uid, None)
            await self.writer.write(group, pg, transitions.bound(new, now))
            return
        admitted = ts(new.admitted_time) or now
        # A member deleted or failed before it was ready (by hand, or replaced by its owner): waiting out
        # the timeout would only keep the others' nodes held and its replacement gated.
        gone = transitions.gone_unready(status, pods)
        if not gone and now - admitted <= self.config.group_ready_timeout_seconds:
            await self.writer.write(group, pg, new)
            return
        await self._time_out(group, pg, new, now, gone)

    async def _time_out(
        self,
        group: GroupView,
        pg: dict[str, Any] | None,
        status: PlacementGroupStatus,
        now: float,
        gone: list[str] | None = None,
    ) -> None:
        backoff = backoff_s(status.attempts, self.backoff_base)
        timeout = self.config.group_ready_timeout_seconds
        new = transitions.timed_out(
            status, group.spec.key, timeout, backoff, now, present=set(self.tables.pods), gone=gone
        )
        # The reason is recorded before anything is evicted.
        await self.writer.write(group, pg, new)
        evict = new.members
        log.warning("group timed out, evicting its pods", extra={"group": group.spec.key, "pods": len(evict)})
        pods = [self.tables.pods[m.uid] for m in evict]
        self.writer.events(group, pods, "Warning", "GroupTimedOut", new.decision, pg_too=True)
        for m in evict:
            self.tables.held.pop(m.uid, None)
            self.tables.feed_cache(m.uid)
        if not self.leading():
            return  # the Lease lapsed during the write: the next leader evicts from the TimedOut status
        await self.evictor.evict_left(group, new)


def pending_note(pending: list[tuple[dict[str, Any], str]], shown: int = 5) -> str:
    """The pods not counted yet and why, for the decision: the first few by name, then how many more."""
    if not pending:
        return ""
    named = sorted((podview.name(p), why) for p, why in pending)
    text = ", ".join(f"pod {name:.253} ({why:.300})" for name, why in named[:shown])
    more = f" and {len(named) - shown} more" if len(named) > shown else ""
    return f"; not counted yet: {text}{more}"


def backoff_s(attempts: int, base: float = BACKOFF_BASE_S) -> float:
    """Seconds before a timed-out group is admitted again: doubling per admission, capped. The exponent
    is bounded first: `attempts` is read back from the PlacementGroup, and 2 ** (a huge count) would take
    the process's memory and time before the cap applied."""
    return Backoff(base, BACKOFF_CAP_S, jitter=False).delay(attempts - 1)
