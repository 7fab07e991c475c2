"""What the topology shell writes, and how: discovery of the targets, the owner reference, each
target's objects compared with what was last written, and the FabricTopology report. Every method is
synchronous (the shell runs a pass in a worker thread) and raises nothing but what `reconcile` handles.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import kubernetes
import urllib3

from nodefabric_operator import events
from nodefabric_operator.metrics import Metrics
from nodefabric_operator.topology import project, report
from nodefabric_operator.topology.nesting import Hierarchy

log = logging.getLogger(__name__)

# What a failed request raises: retried by the shell with backoff.
API_ERRORS = (kubernetes.client.ApiException, urllib3.exceptions.HTTPError, OSError)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_of(err: BaseException) -> int:
    return int(getattr(err, "status", 0) or 0)


def brief(err: BaseException) -> str:
    """One short reason: `HTTP 503 Service Unavailable`, or the first line of anything else."""
    status = status_of(err)
    if status:
        return f"HTTP {status} {getattr(err, 'reason', '') or ''}".strip()
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:300]


def _held(kind: str, name: str, finalizers: str) -> str:
    return f"{kind} {name} is being deleted, held by finalizers {finalizers}: written once it is gone"


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
    ) -> None:
        self.api = api
        self.custom = kubernetes.client.CustomObjectsApi(api)
        self.metrics = metrics
        self.targets = tuple(targets)
        self.name = name
        self.owner = owner
        self.discovery_ttl = discovery_ttl
        self.event = event
        self.clock = clock
        self.served: dict[str, str | None] = {}  # target -> version served (None: not served)
        self.retry = False  # a write failed: the shell passes again after a backoff
        self._discovered_at: float | None = None
        self._known: dict[str, Any] = {}  # target -> what the server holds as far as we know
        self._taken: frozenset[str] = frozenset()  # HyperNode names held by HyperNodes we do not manage
        self._replacing: dict[str, tuple[str, ...]] = {}  # target -> levels of the one deleted to be replaced
        self._report_status: dict[str, Any] | None = None
        self._report_known = False
        self._exists = False
        self._owner_ref: dict[str, Any] | None = None
        self._owner_read = False

    def forget(self) -> None:
        """Read every target and the discovery again on the next pass."""
        self._known.clear()
        self._report_known = False
        self._discovered_at = None

    # --- discovery and ownership ----------------------------------------------------------------------------

    def discover(self) -> None:
        now = self.clock()
        if self._discovered_at is not None and now - self._discovered_at < self.discovery_ttl:
            return
        kueue = next(
            (v for v in project.KUEUE_VERSIONS if self._serves(project.KUEUE_GROUP, v, "topologies")), None
        )
        kai = next(
            (v for v in project.KAI_VERSIONS if self._serves(project.KAI_GROUP, v, "topologies")), None
        )
        self.served = {
            project.KUEUE: kueue,
            project.KAI: kai,
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
            if status_of(err) == 404:
                return False
            raise
        except ValueError:
            return False
        resources = data.get("resources") if isinstance(data, dict) else None
        return isinstance(resources, list) and any(
            isinstance(r, dict) and r.get("name") == plural for r in resources
        )

    @property
    def owner_ready(self) -> bool:
        """No owner asked for, or its uid read (or refused for good: then objects go unowned)."""
        return not self.owner or self._owner_read

    def read_owner(self) -> None:
        """The owner's uid, read once. Refused (403) or missing (404): said, and objects are written
        without it (uninstall then leaves them). Any other failure raises: nothing is written until it is
        read, since an object created without its owner would stay unowned."""
        if self.owner_ready or self.owner is None:
            return
        rbac = kubernetes.client.RbacAuthorizationV1Api(self.api)
        self.metrics.api_requests.labels(verb="get", resource="clusterroles").inc()
        try:
            role = rbac.read_cluster_role(self.owner)
        except kubernetes.client.ApiException as err:
            if status_of(err) not in (403, 404):
                raise
            log.warning(
                "cannot read the owner ClusterRole: projected objects will not be removed on uninstall",
                extra={"owner": self.owner, "error": brief(err)},
            )
            self._owner_read = True
            return
        self._owner_ref = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "name": self.owner,
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
            return project.KAI_GROUP, self.served[target] or project.KAI_VERSIONS[-1], "topologies"
        return project.VOLCANO_GROUP, project.VOLCANO_VERSION, "hypernodes"

    def write_target(self, target: str, hierarchy: Hierarchy, fleet: Mapping[str, Mapping[str, str]]) -> str:
        try:
            if target == project.VOLCANO:
                return self._write_volcano(hierarchy, fleet)
            if target == project.KUEUE:
                body, levels = project.kueue_topology(hierarchy, self.name, self.served[target] or "")
            else:
                body, levels = project.kai_topology(hierarchy, self.name, self.served[target] or "")
            state = self._write_topology(target, body)
            if levels.dropped:
                state += f"; left out for the level limit: {', '.join(levels.dropped)}"
            return state
        except API_ERRORS as err:
            self._known.pop(target, None)  # read the server again next time
            self.retry = True
            reason = brief(err)
            self.event(events.for_failure(report.WRITE_FAILED, f"{target}: {reason}"))
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
            if status_of(err) == 404:
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
            held = project.held_by(live)
            if held is not None:
                # Being deleted (by us to replace it, or by someone), kept by its finalizers (Kueue's while a
                # ResourceFlavor names it): nothing can be written under its name until it is gone.
                self.retry = True
                return _held(body["kind"], name, held)
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
            try:
                self._call("patch", target, self.custom.patch_cluster_custom_object, g, v, p, name, patch)
            except kubernetes.client.ApiException as err:
                if status_of(err) != 404:
                    raise
                # Deleted since we wrote it: written again, as a HyperNode is.
                self._call(
                    "create", target, self.custom.create_cluster_custom_object, g, v, p, self._owned(body)
                )
        else:
            if action == project.REPLACE:
                self._call("delete", target, self.custom.delete_cluster_custom_object, g, v, p, name)
                self._replacing[target] = tuple(self._known[target] or ())
                self._known[target] = None
            try:
                self._call(
                    "create", target, self.custom.create_cluster_custom_object, g, v, p, self._owned(body)
                )
            except kubernetes.client.ApiException as err:
                if status_of(err) != 409 or target not in self._replacing:
                    raise
                # The delete was accepted but the object stays until its finalizers go: said once, and
                # the create is retried (the next pass reads it again) rather than the delete repeated.
                self._known.pop(target, None)
                self.retry = True
                live = self._get(target, name)
                held = project.held_by(live) or "[]"
                self.event(
                    events.Notice(
                        events.WARNING,
                        report.REPLACE_PENDING,
                        f"{target} {body['kind']} {name} deleted to be replaced (its levels cannot change "
                        f"in place) but held by finalizers {held}: written once it is gone",
                    )
                )
                return _held(body["kind"], name, held)
            old = self._replacing.pop(target, None)
            if old is not None:
                self.event(
                    events.Notice(
                        events.NORMAL,
                        report.REPLACED,
                        f"{target} {body['kind']} {name} replaced: its levels cannot change in place "
                        f"({', '.join(old)} -> {', '.join(desired)})",
                    )
                )
        self._known[target] = desired
        log.info("topology written", extra={"target": target, "object": name, "action": action})
        return state

    def _write_volcano(self, hierarchy: Hierarchy, fleet: Mapping[str, Mapping[str, str]]) -> str:
        target = project.VOLCANO
        if target not in self._known:
            self._known[target], self._taken = self._list_hypernodes()
        taken = set(self._taken)
        state = self._write_hypernodes(project.hypernodes(hierarchy, fleet, taken=self._taken))
        if self._taken != taken:
            # A name met taken on create: its parent was built naming it, so build once more without it.
            state = self._write_hypernodes(project.hypernodes(hierarchy, fleet, taken=self._taken))
        if self._taken:
            wanted = project.hypernodes(hierarchy, fleet)
            held = sorted(n for n in self._taken if n in wanted)
            if held:
                shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
                state += f"; left out, their names held by HyperNodes not managed by nodefabric: {shown}"
        return state

    def _list_hypernodes(self) -> tuple[dict[str, Any], frozenset[str]]:
        """Ours (name -> spec) and the names every other HyperNode holds."""
        target = project.VOLCANO
        g, v, p = self._gvp(target)
        got = self._call("list", target, self.custom.list_cluster_custom_object, g, v, p)
        ours: dict[str, Any] = {}
        theirs: set[str] = set()
        for i in got.get("items", []):
            if not isinstance(i, dict):
                continue
            name = str(i["metadata"]["name"])
            if project.is_managed(i):
                ours[name] = i.get("spec")
            else:
                theirs.add(name)
        return ours, frozenset(theirs)

    def _write_hypernodes(self, desired: Mapping[str, dict[str, Any]]) -> str:
        target = project.VOLCANO
        g, v, p = self._gvp(target)
        known: dict[str, Any] = self._known[target]
        written = 0
        for name, body in desired.items():
            if name not in known:
                try:
                    self._call(
                        "create", target, self.custom.create_cluster_custom_object, g, v, p, self._owned(body)
                    )
                except kubernetes.client.ApiException as err:
                    if status_of(err) != 409:
                        raise
                    live = self._get(target, name)
                    if live is not None and not project.is_managed(live):
                        self._taken = self._taken | {name}  # someone else's HyperNode of that name
                        continue
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
                    if status_of(err) != 404:
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
                if status_of(err) != 404:
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

    def clean_disabled(self) -> None:
        """Objects of a target the configuration no longer allows go, once at start (a chart upgrade that
        turned the target off)."""
        for target in project.TARGETS:
            if target in self.targets or self.served.get(target) is None:
                continue
            g, v, p = self._gvp(target)
            try:
                if target == project.VOLCANO:
                    names = list(self._list_managed(target))
                else:
                    live = self._get(target, self.name)
                    names = [self.name] if live is not None and project.is_managed(live) else []
                for name in names:
                    self._call("delete", target, self.custom.delete_cluster_custom_object, g, v, p, name)
                if names:
                    log.info(
                        "removed the objects of a disabled target",
                        extra={"target": target, "objects": len(names)},
                    )
            except API_ERRORS as err:
                log.warning(
                    "cannot remove a disabled target's objects",
                    extra={"target": target, "error": brief(err)},
                )

    # --- the report -----------------------------------------------------------------------------------------

    def write_report(self, hierarchy: Hierarchy, states: Mapping[str, str]) -> None:
        if self.served.get("report") is None:
            return
        g, v, p = report.GROUP, report.VERSION, report.PLURAL
        try:
            if not self._report_known:
                self.metrics.api_requests.labels(verb="get", resource=p).inc()
                try:
                    live = self.custom.get_cluster_custom_object(g, v, p, report.NAME)
                except kubernetes.client.ApiException as err:
                    if status_of(err) != 404:
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
        except API_ERRORS as err:
            self._report_known = False
            self.retry = True
            log.warning("cannot write the topology report", extra={"error": brief(err)})
