"""The thin shell: keeps the fleet's level labels from the Node watch, and after a quiet moment (the
debounce) checks the hierarchy and writes what changed.

Request budget: nothing per Devices record and nothing per Node event; a pass reads each target once when
it first meets it (and after a failed write), then compares with what it last wrote and writes only a
difference, like the agent. A pass also runs every `resync` seconds, so a target whose CRD is installed
later is picked up; discovery is re-read at most every `discovery_ttl` seconds.

Uninstall: every object carries an ownerReference to the operator's ClusterRole when `owner` names it
(the chart does), so deleting the release lets the garbage collector remove them; no finalizer is used.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kubernetes
import urllib3

from nodefabric_operator import events
from nodefabric_operator.extender.config import Level
from nodefabric_operator.metrics import Metrics
from nodefabric_operator.recorder import Recorder
from nodefabric_operator.topology import project, report
from nodefabric_operator.topology.levels import default_levels
from nodefabric_operator.topology.nesting import Hierarchy, check

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


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(err: BaseException) -> int:
    return int(getattr(err, "status", 0) or 0)


def _brief(err: BaseException) -> str:
    status = _status(err)
    if status:
        return f"HTTP {status} {getattr(err, 'reason', '') or ''}".strip()
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:300]


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
        self.custom = kubernetes.client.CustomObjectsApi(api)
        self.options = options
        self.metrics = metrics
        self.recorder = recorder
        self.clock = clock
        self.keys = frozenset(k for lv in options.levels for k in lv.keys)
        self.fleet: dict[str, dict[str, str]] = {}
        self.hierarchy: Hierarchy | None = None
        self.served: dict[str, str | None] = {}  # target -> version served (None: not served)
        self._discovered_at: float | None = None
        self._known: dict[str, Any] = {}  # target -> what the server holds as far as we know
        self._report_status: dict[str, Any] | None = None
        self._report_known = False
        self._exists = False
        self._owner_ref: dict[str, Any] | None = None
        self._owner_read = False
        self._cleaned = False
        self._dirty = asyncio.Event()
        self._retry = False
        self._failures = 0

    def prime(self, page: int = 500) -> None:
        """Read the fleet once before kopf starts (one paged list of Nodes), so the first pass sees every
        node: a pass over the part kopf had delivered so far would write, and for KAI replace, a
        projection of a smaller fleet."""
        core = kubernetes.client.CoreV1Api(self.api)
        token: str | None = None
        while True:
            self.metrics.api_requests.labels(verb="list", resource="nodes").inc()
            answer: Any = core.list_node(limit=page, _continue=token, _preload_content=False)
            data = json.loads(answer.data)
            for item in data.get("items") or ():
                self.node_event("ADDED", item)
            token = (data.get("metadata") or {}).get("continue") or None
            if not token:
                return

    # --- the Node watch -------------------------------------------------------------------------------------

    def node_event(self, event_type: str | None, body: Mapping[str, Any]) -> bool:
        """Keep the node's level labels; True when they changed (a pass is then due)."""
        meta = body.get("metadata")
        if not isinstance(meta, Mapping) or not meta.get("name"):
            return False
        name = str(meta["name"])
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
        loop = asyncio.get_running_loop()
        while True:
            try:
                await asyncio.wait_for(self._dirty.wait(), self.options.resync)
            except TimeoutError:
                # A resync reads every target again: an object someone deleted or edited is rewritten.
                self._forget()
            first = loop.time()
            while True:
                self._dirty.clear()
                await asyncio.sleep(self.options.debounce)
                if not self._dirty.is_set() or loop.time() - first >= 10 * self.options.debounce:
                    break
            self._dirty.clear()
            fleet = {n: dict(labs) for n, labs in self.fleet.items()}
            try:
                await asyncio.to_thread(self.reconcile, fleet)
            except Exception:  # a pass never ends the loop; the next one starts from what the server holds
                log.exception("topology pass failed")
                self._forget()
                self._retry = True
            if self._retry:
                # A failed write is retried, backing off to the resync period (an API server that keeps
                # refusing is asked every few minutes, not every few seconds).
                self._retry = False
                self._failures += 1
                delay = min(RETRY_FIRST * 2 ** min(self._failures - 1, 16), self.options.resync)
                loop.call_later(max(self.options.debounce, delay), self._dirty.set)
            else:
                self._failures = 0

    def _forget(self) -> None:
        self._known.clear()
        self._report_known = False
        self._discovered_at = None

    # --- one pass -------------------------------------------------------------------------------------------

    def reconcile(self, fleet: Mapping[str, Mapping[str, str]]) -> Hierarchy:
        started = time.perf_counter()
        hierarchy = check(self.options.levels, fleet)
        before, self.hierarchy = self.hierarchy, hierarchy
        for level, count in hierarchy.violations_by_level().items():
            self.metrics.topology_violations.labels(level=level).set(count)
        try:
            self._discover()
        except (kubernetes.client.ApiException, urllib3.exceptions.HTTPError, OSError) as err:
            # Retried with backoff; the last answer stands meanwhile, and with none nothing is written.
            self._retry = True
            log.warning("topology discovery failed", extra={"error": _brief(err)})
            if not self.served:
                return hierarchy
        self._read_owner()
        if not self._cleaned:
            self._clean_disabled()
            self._cleaned = True
        states: dict[str, str] = {}
        for target in project.TARGETS:
            if target not in self.options.targets:
                states[target] = "disabled by configuration"
            elif self.served.get(target) is None:
                states[target] = "CRD not served"
            else:
                states[target] = self._write_target(target, hierarchy, fleet)
        self._write_report(hierarchy, states)
        for notice in report.notices(before, hierarchy):
            self._event(notice)
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

    # --- discovery and ownership ----------------------------------------------------------------------------

    def _discover(self) -> None:
        now = self.clock()
        if self._discovered_at is not None and now - self._discovered_at < self.options.discovery_ttl:
            return
        kueue = next(
            (v for v in project.KUEUE_VERSIONS if self._serves(project.KUEUE_GROUP, v, "topologies")), None
        )
        self.served = {
            project.KUEUE: kueue,
            project.KAI: project.KAI_VERSION
            if self._serves(project.KAI_GROUP, project.KAI_VERSION, "topologies")
            else None,
            project.VOLCANO: project.VOLCANO_VERSION
            if self._serves(project.VOLCANO_GROUP, project.VOLCANO_VERSION, "hypernodes")
            else None,
            "report": report.VERSION if self._serves(report.GROUP, report.VERSION, report.PLURAL) else None,
        }
        self._discovered_at = now

    def _serves(self, group: str, version: str, plural: str) -> bool:
        self.metrics.api_requests.labels(verb="get", resource="discovery").inc()
        try:
            # Undecoded: the client's model would drop nothing we need, but costs a parse per resource.
            answer: Any = self.custom.get_api_resources(
                group, version, _preload_content=False, _request_timeout=10
            )
            data = json.loads(answer.data)
        except kubernetes.client.ApiException as err:
            if _status(err) == 404:
                return False
            raise
        except ValueError:
            return False
        resources = data.get("resources") if isinstance(data, dict) else None
        return isinstance(resources, list) and any(
            isinstance(r, dict) and r.get("name") == plural for r in resources
        )

    def _read_owner(self) -> None:
        if self._owner_read or not self.options.owner:
            return
        rbac = kubernetes.client.RbacAuthorizationV1Api(self.api)
        self.metrics.api_requests.labels(verb="get", resource="clusterroles").inc()
        try:
            role = rbac.read_cluster_role(self.options.owner)
        except kubernetes.client.ApiException as err:
            log.warning(
                "cannot read the owner ClusterRole: projected objects will not be removed on uninstall",
                extra={"owner": self.options.owner, "error": f"HTTP {_status(err)}"},
            )
            self._owner_read = True
            return
        self._owner_ref = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "name": self.options.owner,
            "uid": role.metadata.uid if role.metadata else None,
        }
        self._owner_read = True

    def _owned(self, body: dict[str, Any]) -> dict[str, Any]:
        if self._owner_ref is not None:
            body["metadata"]["ownerReferences"] = [dict(self._owner_ref)]
        return body

    # --- the targets ----------------------------------------------------------------------------------------

    def _gvp(self, target: str) -> tuple[str, str, str]:
        if target == project.KUEUE:
            return project.KUEUE_GROUP, self.served[target] or project.KUEUE_VERSIONS[0], "topologies"
        if target == project.KAI:
            return project.KAI_GROUP, project.KAI_VERSION, "topologies"
        return project.VOLCANO_GROUP, project.VOLCANO_VERSION, "hypernodes"

    def _write_target(self, target: str, hierarchy: Hierarchy, fleet: Mapping[str, Mapping[str, str]]) -> str:
        try:
            if target == project.VOLCANO:
                return self._write_hypernodes(project.hypernodes(hierarchy, fleet))
            if target == project.KUEUE:
                body, levels = project.kueue_topology(hierarchy, self.options.name, self.served[target] or "")
            else:
                body, levels = project.kai_topology(hierarchy, self.options.name)
            state = self._write_topology(target, body)
            if levels.dropped:
                state += f"; left out for the level limit: {', '.join(levels.dropped)}"
            return state
        except (kubernetes.client.ApiException, urllib3.exceptions.HTTPError, OSError) as err:
            self._known.pop(target, None)  # read the server again next time
            self._retry = True
            reason = _brief(err)
            self._event(events.for_failure(report.WRITE_FAILED, f"{target}: {reason}"))
            log.warning("topology write failed", extra={"target": target, "error": reason[:300]})
            return f"write failed: {reason[:200]}"

    def _call(self, verb: str, target: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self.metrics.api_requests.labels(verb=verb, resource=self._gvp(target)[2]).inc()
        result = fn(*args, **kwargs)
        if verb in ("create", "patch", "delete"):
            self.metrics.topology_writes.labels(target=target, verb=verb).inc()
        return result

    def _get(self, target: str, name: str) -> dict[str, Any] | None:
        g, v, p = self._gvp(target)
        try:
            got: dict[str, Any] = self._call(
                "get", target, self.custom.get_cluster_custom_object, g, v, p, name
            )
        except kubernetes.client.ApiException as err:
            if _status(err) == 404:
                return None
            raise
        return got

    def _write_topology(self, target: str, body: dict[str, Any]) -> str:
        g, v, p = self._gvp(target)
        name = body["metadata"]["name"]
        desired = project.levels_of(body) or ()
        if target not in self._known:
            live = self._get(target, name)
            if live is not None and not project.is_managed(live):
                return f"{p} {name} exists and is not managed by nodefabric: left alone"
            self._known[target] = project.levels_of(live)
        action = project.topology_action(
            self._known[target], desired, mutable_with_hostname=target == project.KUEUE
        )
        # The state names the result, not the action, so the report does not change back and forth.
        state = f"{body['kind']} {name}: {len(desired)} levels"
        if action == project.NONE:
            return state
        if action == project.UPDATE:
            patch = {"spec": {"levels": body["spec"]["levels"]}}
            self._call("patch", target, self.custom.patch_cluster_custom_object, g, v, p, name, patch)
        else:
            if action == project.REPLACE:
                self._call("delete", target, self.custom.delete_cluster_custom_object, g, v, p, name)
                self._event(
                    events.Notice(
                        events.NORMAL,
                        report.REPLACED,
                        f"{target} {body['kind']} {name} replaced: its levels cannot change in place "
                        f"({', '.join(self._known[target] or ())} -> {', '.join(desired)})",
                    )
                )
                self._known[target] = None
            self._call("create", target, self.custom.create_cluster_custom_object, g, v, p, self._owned(body))
        self._known[target] = desired
        log.info("topology written", extra={"target": target, "object": name, "action": action})
        return state

    def _write_hypernodes(self, desired: Mapping[str, dict[str, Any]]) -> str:
        target = project.VOLCANO
        g, v, p = self._gvp(target)
        if target not in self._known:
            self._known[target] = self._list_managed(target)
        known: dict[str, Any] = self._known[target]
        written = 0
        for name, body in desired.items():
            if name not in known:
                try:
                    self._call(
                        "create", target, self.custom.create_cluster_custom_object, g, v, p, self._owned(body)
                    )
                except kubernetes.client.ApiException as err:
                    if _status(err) != 409:
                        raise
                    live = self._get(target, name)
                    if live is not None and not project.is_managed(live):
                        continue  # someone else's HyperNode of that name
                    self._call(
                        "patch",
                        target,
                        self.custom.patch_cluster_custom_object,
                        g,
                        v,
                        p,
                        name,
                        {"spec": body["spec"]},
                    )
            elif known[name] != body["spec"]:
                try:
                    self._call(
                        "patch",
                        target,
                        self.custom.patch_cluster_custom_object,
                        g,
                        v,
                        p,
                        name,
                        {"spec": body["spec"]},
                    )
                except kubernetes.client.ApiException as err:
                    if _status(err) != 404:
                        raise
                    # Deleted since we wrote it: written again.
                    self._call(
                        "create", target, self.custom.create_cluster_custom_object, g, v, p, self._owned(body)
                    )
            else:
                continue
            known[name] = body["spec"]
            written += 1
        for name in sorted(set(known) - set(desired)):
            try:
                self._call("delete", target, self.custom.delete_cluster_custom_object, g, v, p, name)
            except kubernetes.client.ApiException as err:
                if _status(err) != 404:
                    raise
            del known[name]
            written += 1
        if written:
            log.info("hypernodes written", extra={"objects": len(desired), "written": written})
        return f"{len(desired)} HyperNodes"

    def _list_managed(self, target: str) -> dict[str, Any]:
        g, v, p = self._gvp(target)
        selector = f"{project.MANAGED_BY}={project.MANAGER}"
        got = self._call(
            "list", target, self.custom.list_cluster_custom_object, g, v, p, label_selector=selector
        )
        return {
            str(i["metadata"]["name"]): i.get("spec")
            for i in got.get("items", [])
            if isinstance(i, dict) and project.is_managed(i)
        }

    def _clean_disabled(self) -> None:
        """Objects of a target the configuration no longer allows go, once at start (a chart upgrade that
        turned the target off)."""
        for target in project.TARGETS:
            if target in self.options.targets or self.served.get(target) is None:
                continue
            g, v, p = self._gvp(target)
            try:
                if target == project.VOLCANO:
                    names = list(self._list_managed(target))
                else:
                    live = self._get(target, self.options.name)
                    names = [self.options.name] if live is not None and project.is_managed(live) else []
                for name in names:
                    self._call("delete", target, self.custom.delete_cluster_custom_object, g, v, p, name)
                if names:
                    log.info(
                        "removed the objects of a disabled target",
                        extra={"target": target, "objects": len(names)},
                    )
            except (kubernetes.client.ApiException, urllib3.exceptions.HTTPError, OSError) as err:
                log.warning(
                    "cannot remove a disabled target's objects",
                    extra={"target": target, "error": _brief(err)},
                )

    # --- the report -----------------------------------------------------------------------------------------

    def _write_report(self, hierarchy: Hierarchy, states: Mapping[str, str]) -> None:
        if self.served.get("report") is None:
            return
        g, v, p = report.GROUP, report.VERSION, report.PLURAL
        try:
            if not self._report_known:
                self.metrics.api_requests.labels(verb="get", resource=p).inc()
                try:
                    live = self.custom.get_cluster_custom_object(g, v, p, report.NAME)
                except kubernetes.client.ApiException as err:
                    if _status(err) != 404:
                        raise
                    live = None
                self._report_status = live.get("status") if isinstance(live, dict) else None
                self._exists = live is not None
                self._report_known = True
            previous = (self._report_status or {}).get("conditions") or []
            status = report.status(hierarchy, states, _now(), previous)
            if status == self._report_status:
                return
            self.metrics.api_requests.labels(verb="patch" if self._exists else "create", resource=p).inc()
            if self._exists:
                self.custom.patch_cluster_custom_object(g, v, p, report.NAME, {"status": status})
            else:
                self.custom.create_cluster_custom_object(g, v, p, self._owned(report.body(status)))
                self._exists = True
            self._report_status = status
        except (kubernetes.client.ApiException, urllib3.exceptions.HTTPError, OSError) as err:
            self._report_known = False
            self._retry = True
            log.warning("cannot write the topology report", extra={"error": _brief(err)})

    def _event(self, notice: events.Notice) -> None:
        if self.recorder is None:
            return
        involved = {"apiVersion": report.API_VERSION, "kind": report.KIND, "name": report.NAME}
        self.recorder.post(involved, notice, action=ACTION)

    def health(self) -> dict[str, int]:
        return {"topologyNodes": len(self.fleet)}


def parse_targets(text: str) -> tuple[str, ...]:
    """`kueue,kai,volcano` (any subset; empty: none)."""
    out = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [t for t in out if t not in project.TARGETS]
    if bad:
        raise ValueError(f"unknown topology targets {bad}: choose from {', '.join(project.TARGETS)}")
    return out
