"""What the topology shell writes, and how: discovery of the targets and the owner (discovery), each
target's objects compared with what was last written (topologies for Kueue and KAI, hypernodes for
Volcano, all through objects), and the FabricTopology report. Every method is synchronous (the shell runs
a pass in a worker thread) and raises nothing but what `reconcile` handles.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import kubernetes

from nodefabric_devicemanager.nodeclient.objects import resource_version
from nodefabric_operator import events
from nodefabric_operator.metrics import Metrics
from nodefabric_operator.rawcall import status_of
from nodefabric_operator.topology import project, report
from nodefabric_operator.topology.discovery import KNOWN, Discovery
from nodefabric_operator.topology.hypernodes import HyperNodeWriter
from nodefabric_operator.topology.nesting import Hierarchy
from nodefabric_operator.topology.objects import API_ERRORS, Objects, brief, go_on, name_of
from nodefabric_operator.topology.sweep import Sweeper
from nodefabric_operator.topology.topologies import TopologyWriter

log = logging.getLogger(__name__)


UNSERVED = "CRD not served"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Writer:
    def __init__(
        self,
        api: kubernetes.client.ApiClient,
        metrics: Metrics,
        *,
        targets: Sequence[str],
        name: str,
        owner: str | None,
        discovery_ttl: float,
        event: Callable[[events.Notice], None],
        clock: Callable[[], float] = time.monotonic,
        stopping: threading.Event | None = None,
    ) -> None:
        self.targets = tuple(targets)
        # Set as the operator stops: no request of the pass is sent after it (objects.go_on).
        self.stopping = stopping or threading.Event()
        self.name = name
        self.event = event
        self.retry = False  # a write failed: the shell passes again after a backoff
        self.discovery = Discovery(api, metrics, owner=owner, ttl=discovery_ttl, clock=clock)
        self.objects = Objects(
            api, metrics, lambda: self.discovery.served, self.discovery.owned, stopping=self.stopping
        )
        self.topologies = TopologyWriter(self.objects, event, self._again)
        self.hypernodes = HyperNodeWriter(self.objects)
        self.sweeper = Sweeper(self.objects, name, lambda: self.discovery.owner_uid, event, self._again)
        self._unknown_said: dict[str, tuple[str, ...]] = {}  # target -> the unknown versions said
        self.report = ReportWriter(
            api, metrics, self.discovery.owned, self._again, self.discovery.forget, stopping=self.stopping
        )

    def _again(self) -> None:
        self.retry = True

    @property
    def served(self) -> dict[str, str | None]:
        """target -> version served (None: not served), as discovery last read it."""
        return self.discovery.served

    @property
    def owner_ready(self) -> bool:
        return self.discovery.owner_ready

    def discover(self) -> None:
        go_on(self.stopping)
        self.discovery.discover()

    def read_owner(self) -> None:
        go_on(self.stopping)
        self.discovery.read_owner()

    def forget(self) -> None:
        """Read every target and the discovery again on the next pass."""
        self.objects.known.clear()
        self.report.forget()
        self.discovery.forget()
        self.sweeper.forget()

    def unserved(self, target: str) -> str:
        """The target's CRD is not served (now): its objects went with it (a CRD's deletion takes them),
        so they are read again once it is served again, not believed written until the next resync. The
        target's state: not served, or served only in versions this writer does not know (said once in
        a Warning, as nothing is written for a target the user has installed)."""
        self.objects.known.pop(target, None)
        unknown = self.discovery.unknown.get(target)
        if not unknown:
            self._unknown_said.pop(target, None)
            return UNSERVED
        known = KNOWN[target][1]
        if self._unknown_said.get(target) != unknown:
            self._unknown_said[target] = unknown
            group, plural = KNOWN[target][0], KNOWN[target][2]
            message = (
                f"{target}: the {plural}.{group} CRD is served in {', '.join(unknown)}, and nodefabric "
                f"writes {', '.join(known)} only: nothing written"
            )
            self.event(events.for_failure(report.VERSION_UNSUPPORTED, message))
            log.warning(
                "topology target served only in versions nodefabric does not write",
                extra={"target": target, "served": ",".join(unknown), "supported": ",".join(known)},
            )
        return f"CRD served in {', '.join(unknown)}; nodefabric writes {', '.join(known)}: nothing written"

    def write_target(self, target: str, hierarchy: Hierarchy, fleet: Mapping[str, Mapping[str, str]]) -> str:
        try:
            if target == project.VOLCANO:
                return self.hypernodes.write(hierarchy, fleet)
            self.sweeper.sweep(target)
            if target == project.KUEUE:
                body, levels = project.kueue_topology(hierarchy, self.name, self.served[target] or "")
            else:
                body, levels = project.kai_topology(hierarchy, self.name, self.served[target] or "")
            state = self.topologies.write(target, body)
            if levels.dropped:
                state += f"; left out for the level limit: {', '.join(levels.dropped)}"
            return state
        except API_ERRORS as err:
            self.objects.known.pop(target, None)  # read the server again next time
            self.retry = True
            if status_of(err) == 404:
                # The writers meet an object's 404 themselves (created again, gone already): one that reaches
                # here is the resource's, its CRD deleted since discovery read it. A target uninstalled is
                # no failure: discovery is read again on the next pass, which says it.
                self.discovery.forget()
                log.info("topology target no longer served", extra={"target": target})
                return UNSERVED
            reason = brief(err)
            self.event(events.for_failure(report.WRITE_FAILED, f"{target}: {reason}"))
            log.warning("topology write failed", extra={"target": target, "error": reason[:300]})
            return f"write failed: {reason[:200]}"

    def clean_disabled(self) -> None:
        """Objects of a target the configuration no longer allows go, once at start (a chart upgrade that
        turned the target off). Each at the resourceVersion it was read at: one replaced by someone
        else's since (or its label removed) is left alone."""
        for target in project.TARGETS:
            if target in self.targets or self.served.get(target) is None:
                continue
            try:
                if target == project.VOLCANO:
                    ours = self.objects.labelled(target)
                else:
                    live = self.objects.get(target, self.name)
                    ours = [live] if live is not None and project.is_managed(live) else []
                removed = sum(self.objects.delete_ours(target, name_of(i), resource_version(i)) for i in ours)
                if removed:
                    log.info(
                        "removed the objects of a disabled target",
                        extra={"target": target, "objects": removed},
                    )
            except API_ERRORS as err:
                if status_of(err) == 403:
                    # No right on a disabled target's kinds (RBAC of one's own, or a chart from before it
                    # granted their removal): nothing we may clean, which is no failure. Said once: this
                    # runs once per start.
                    log.info(
                        "no right to remove a disabled target's objects: any it wrote stay",
                        extra={"target": target, "error": brief(err)},
                    )
                    continue
                log.warning(
                    "cannot remove a disabled target's objects",
                    extra={"target": target, "error": brief(err)},
                )

    def write_report(self, hierarchy: Hierarchy, states: Mapping[str, str]) -> None:
        if self.served.get("report") is None:
            return
        self.report.write(hierarchy, states)


class ReportWriter:
    """The FabricTopology object: its status written whole, only when it reads differently."""

    def __init__(
        self,
        api: kubernetes.client.ApiClient,
        metrics: Metrics,
        owned: Callable[[dict[str, Any]], dict[str, Any]],
        again: Callable[[], None],
        rediscover: Callable[[], None],
        *,
        stopping: threading.Event | None = None,
    ) -> None:
        self.custom = kubernetes.client.CustomObjectsApi(api)
        self.stopping = stopping or threading.Event()
        self.metrics = metrics
        self.owned = owned
        self.again = again
        self.rediscover = rediscover  # discovery (and the owner) read again on the next pass
        self._status: dict[str, Any] | None = None
        self._known = False
        self._exists = False

    def forget(self) -> None:
        self._known = False

    def write(self, hierarchy: Hierarchy, states: Mapping[str, str]) -> None:
        g, v, p = report.GROUP, report.VERSION, report.PLURAL
        try:
            if not self._known:
                go_on(self.stopping)
                self.metrics.api_requests.labels(verb="get", resource=p).inc()
                try:
                    live = self.custom.get_cluster_custom_object(g, v, p, report.NAME)
                except kubernetes.client.ApiException as err:
                    if status_of(err) != 404:
                        raise
                    live = None
                self._status = live.get("status") if isinstance(live, dict) else None
                self._exists = live is not None
                self._known = True
            previous = (self._status or {}).get("conditions") or []
            status = report.status(hierarchy, states, _now(), previous)
            if status == self._status:
                return
            go_on(self.stopping)
            self.metrics.api_requests.labels(verb="patch" if self._exists else "create", resource=p).inc()
            if self._exists:
                self.custom.patch_cluster_custom_object(g, v, p, report.NAME, {"status": status})
            else:
                self.custom.create_cluster_custom_object(g, v, p, self.owned(report.body(status)))
                self._exists = True
            self._status = status
        except API_ERRORS as err:
            self._known = False
            self.again()
            if status_of(err) == 404:
                # The object deleted since (it is created again next pass), or its CRD: discovery says which.
                # Deleted with its owner (collected), the owner's new uid is read again too.
                self.rediscover()
            log.warning("cannot write the topology report", extra={"error": brief(err)})
