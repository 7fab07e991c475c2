"""The thin shell: keeps the fleet's level labels from the Node watch, and after a quiet moment (the
debounce) checks the hierarchy and has the writer (topology.writer) write what changed.

Request budget: nothing per Devices record and nothing per Node event; a pass reads each target once when
it first meets it (and after a failed write), then compares with what it last wrote and writes only a
difference, like the agent. A pass also runs every `resync` seconds, so a target whose CRD is installed
later is picked up; discovery is re-read at most every `discovery_ttl` seconds.

Uninstall: every object carries an ownerReference to the operator's ClusterRole when `owner` names it
(the chart does), so deleting the release lets the garbage collector remove them; no finalizer is used.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kubernetes

from nodefabric_devicemanager.backoff import Backoff
from nodefabric_operator import events, sinks
from nodefabric_operator.extender.config import Level
from nodefabric_operator.inflight import writing
from nodefabric_operator.metrics import Metrics
from nodefabric_operator.recorder import Recorder
from nodefabric_operator.topology import project, report
from nodefabric_operator.topology.levels import default_levels
from nodefabric_operator.topology.nesting import Hierarchy, check
from nodefabric_operator.topology.objects import API_ERRORS, brief
from nodefabric_operator.topology.writer import Writer
from nodefabric_operator.view import part

log = logging.getLogger(__name__)

ACTION = "ProjectTopology"  # the Events' action
RETRY_FIRST = 5.0  # seconds before the first retry of a failed write


@dataclass(frozen=True)
class TopologyOptions:
    levels: tuple[Level, ...] = field(default_factory=default_levels)
    targets: tuple[str, ...] = project.TARGETS  # what the chart allows; each also needs its CRD served
    name: str = report.NAME  # the Kueue and KAI Topology's name
    owner: str | None = None  # the ClusterRole that owns every object written (uninstall removes them)
    debounce: float = 2.0
    resync: float = 300.0
    discovery_ttl: float = 60.0


class Projector:
    def __init__(
        self,
        api: kubernetes.client.ApiClient,
        options: TopologyOptions,
        metrics: Metrics,
        recorder: Recorder | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.options = options
        self.metrics = metrics
        self.recorder = recorder
        self.clock = clock
        self.keys = frozenset(k for lv in options.levels for k in lv.keys)
        # Set when the loop is cancelled (the operator stopping) while a pass runs in its worker thread:
        # the pass sends nothing more (objects.go_on, the Events' posts), and the cancel waits for the
        # request in flight (inflight.writing), so nothing lands after the lease is released.
        self.stopping = threading.Event()
        self.fleet: dict[str, dict[str, str]] = {}
        self.hierarchy: Hierarchy | None = None
        self.writer = Writer(
            api,
            metrics,
            targets=options.targets,
            name=options.name,
            owner=options.owner,
            discovery_ttl=options.discovery_ttl,
            event=self._event,
            clock=clock,
            stopping=self.stopping,
        )
        self._cleaned = False
        self._dirty = asyncio.Event()
        self._unconfirmed: set[str] = set()  # listed by prime, not yet reported by kopf
        # kopf's latest listing (at start, and again whenever a watch expired): the nodes it has reported,
        # the fleet as it was when it began (emptied once a resync has taken it), and whether it goes on.
        self._relisted: set[str] = set()
        self._listed_over: set[str] = set()
        self._listing = False
        self._retry = False
        self._failures = 0

    def prime(self) -> None:
        """Read the fleet once before kopf starts (one paged list of Nodes), so the first pass sees every
        node: a pass over the part kopf had delivered so far would write, and for KAI replace, a
        projection of a smaller fleet. Read as the operator's other lists at start are (sinks.pages): each
        page up to wire.MAX_ANSWER, within rawcall's timeouts, and one that is no list page a SinkError
        (its answer was read whole, unbounded, and a page that was no object raised an AttributeError);
        taken only once every page is read."""
        nodes = list(sinks.pages(self.metrics, "nodes", sinks.listing(self.api, "/api/v1/nodes")))
        for item in nodes:
            self.node_event("ADDED", item)
        # kopf lists again when it starts and reports nothing of a node deleted in between: what it has
        # not reported by the first resync is dropped then.
        self._unconfirmed = {str(part(item, "metadata").get("name") or "") for item in nodes} - {""}

    # --- the Node watch -------------------------------------------------------------------------------------

    def node_event(self, event_type: str | None, body: Mapping[str, Any]) -> bool:
        """Keep the node's level labels; True when they changed (a pass is then due)."""
        meta = body.get("metadata")
        if not isinstance(meta, Mapping) or not meta.get("name"):
            return False
        name = str(meta["name"])
        self._unconfirmed.discard(name)
        if event_type is None:
            if not self._listing or name in self._relisted:
                # A listing begins: it reports what exists and nothing of what was deleted while no watch
                # ran (kopf lists again when a watch cannot resume), so what it leaves out is checked.
                self._relisted, self._listed_over = set(), set(self.fleet)
            self._listing = True
            self._relisted.add(name)
        else:
            self._listing = False
        if event_type == "DELETED":
            changed = self.fleet.pop(name, None) is not None
        else:
            got = meta.get("labels")
            ours = {k: str(v) for k, v in got.items() if k in self.keys} if isinstance(got, Mapping) else {}
            changed = self.fleet.get(name) != ours
            self.fleet[name] = ours
        if changed:
            self._dirty.set()
        return changed

    # --- the loop -------------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Pass once changes have been quiet for `debounce` seconds (a burst waits at most ten times that),
        and every `resync` seconds."""
        self._dirty.set()  # the first pass, once kopf's listing has delivered the fleet
        self.stopping.clear()  # kopf started again (cli._kopf) after a stop that set it
        loop = asyncio.get_running_loop()
        resynced = loop.time()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._dirty.wait(), max(self.options.resync - (loop.time() - resynced), 0.0)
                )
            if loop.time() - resynced >= self.options.resync:
                # A resync reads every target again: an object someone deleted or edited is rewritten. It
                # is due by the clock, so a fleet whose labels keep changing does not put it off forever.
                self._forget()
                self._drop_unconfirmed()
                resynced = loop.time()
            first = loop.time()
            while True:
                self._dirty.clear()
                await asyncio.sleep(self.options.debounce)
                if not self._dirty.is_set() or loop.time() - first >= 10 * self.options.debounce:
                    break
            self._dirty.clear()
            fleet = {n: dict(labs) for n, labs in self.fleet.items()}
            try:
                await writing(self.reconcile, fleet, stopping=self.stopping)
            except Exception:  # a pass never ends the loop; the next one starts from what the server holds
                log.exception("topology pass failed")
                self._forget()
                self._retry = True
            if self._retry:
                # A failed write is retried, backing off to the resync period (an API server that keeps
                # refusing is asked every few minutes, not every few seconds).
                self._retry = False
                self._failures += 1
                delay = Backoff(RETRY_FIRST, self.options.resync, jitter=False).delay(self._failures - 1)
                loop.call_later(max(self.options.debounce, delay), self._dirty.set)
            else:
                self._failures = 0

    def _forget(self) -> None:
        self.writer.forget()

    def _drop_unconfirmed(self) -> None:
        gone = sorted(n for n in self._unconfirmed if self.fleet.pop(n, None) is not None)
        # Nodes the latest listing has not reported: deleted while the watch was down, or not reported yet.
        # Dropped at the next resync unless an event names them by then, so a listing has a whole period
        # to finish.
        self._unconfirmed = self._listed_over - self._relisted
        self._listed_over = set()
        if gone:
            log.info(
                "nodes no listing of the watch reported are dropped (deleted while it was down)",
                extra={"nodes": len(gone), "first": ", ".join(gone[:3])},
            )

    # --- one pass -------------------------------------------------------------------------------------------

    def reconcile(self, fleet: Mapping[str, Mapping[str, str]]) -> Hierarchy:
        started = time.perf_counter()
        hierarchy = check(self.options.levels, fleet)
        before = self.hierarchy  # what Events were last said against; kept when this pass writes nothing
        for level, count in hierarchy.violations_by_level().items():
            self.metrics.topology_violations.labels(level=level).set(count)
        w = self.writer
        try:
            w.discover()
            w.read_owner()
        except API_ERRORS as err:
            # Retried with backoff; the last discovery stands meanwhile, and with none nothing is written.
            self._retry = True
            log.warning("topology discovery failed", extra={"error": brief(err)})
            if not w.served or not w.owner_ready:
                return hierarchy
        if not self._cleaned:
            w.clean_disabled()
            self._cleaned = True
        states: dict[str, str] = {}
        for target in project.TARGETS:
            if target not in self.options.targets:
                states[target] = "disabled by configuration"
            elif w.served.get(target) is None:
                states[target] = w.unserved(target)
            else:
                states[target] = w.write_target(target, hierarchy, fleet)
        w.write_report(hierarchy, states)
        if w.retry:
            w.retry = False
            self._retry = True
        for notice in report.notices(before, hierarchy):
            self._event(notice)
        self.hierarchy = hierarchy
        if before is None or before.projected != hierarchy.projected or before.violations:
            log.info(
                "topology checked",
                extra={
                    "nodes": hierarchy.nodes,
                    "projected": ",".join(lv.name for lv in hierarchy.projected),
                    "violations": len(hierarchy.violations),
                    "targets": "; ".join(f"{t}: {s}" for t, s in states.items()),
                },
            )
        self.metrics.topology_duration.observe(time.perf_counter() - started)
        return hierarchy

    def _event(self, notice: events.Notice) -> None:
        if self.recorder is None:
            return
        involved = {"apiVersion": report.API_VERSION, "kind": report.KIND, "name": report.NAME}
        self.recorder.post(involved, notice, action=ACTION, stopping=self.stopping)

    def health(self) -> dict[str, int]:
        return {"topologyNodes": len(self.fleet)}


def parse_targets(text: str) -> tuple[str, ...]:
    """`kueue,kai,volcano` (any subset; empty: none)."""
    out = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [t for t in out if t not in project.TARGETS]
    if bad:
        raise ValueError(f"unknown topology targets {bad}: choose from {', '.join(project.TARGETS)}")
    return out
