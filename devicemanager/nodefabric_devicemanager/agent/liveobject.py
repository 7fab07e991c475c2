"""The agent's Devices object as the API server last showed it, and every request about it.

The agent keeps the object as it last wrote or saw it, so a pass whose reading did not change costs no
request at all; a 409 on a write, or the watch, tells it when someone else changed the object. Requests
take turns on one API thread with a deadline (`workers.Lane`): one request answers within its socket
timeout, the deadline only bounds a thread that hangs anyway.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Any

from nodefabric_devicemanager import workers
from nodefabric_devicemanager.agent import publish
from nodefabric_devicemanager.agent.kube import DevicesClient
from nodefabric_devicemanager.agent.metrics import AgentMetrics
from nodefabric_devicemanager.agent.watch import ObjectWatch
from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_devicemanager.nodeclient import ApiFailure, metadata, owner_reference, resource_version

log = logging.getLogger("nodefabric_devicemanager.agent.core")  # one logger for the agent's passes

# One request answers within its socket timeout (10 s); the deadline only bounds a thread that hangs anyway.
API_DEADLINE_S = 30.0


class LiveObject:
    """The object as last written or seen (`live`; `known` False: it must be listed first), its watch,
    and the writes a pass's plan asks for. `synced` is set when someone else changed it."""

    def __init__(self, client: DevicesClient, node: str, metrics: AgentMetrics) -> None:
        self.client = client
        self.node = node
        self.metrics = metrics
        self.live: dict[str, Any] | None = None
        self.known = False
        self._parsed: tuple[str, DevicesSpec | None] | None = None  # (resourceVersion, its spec)
        # Versions of the object this agent wrote or listed: their watch events, arriving after a later write
        # of ours, are old news (resourceVersions are opaque: they are matched, never ordered).
        self._versions: collections.deque[str] = collections.deque(maxlen=16)
        self._writing = False
        self._held: list[dict[str, Any]] = []
        self.synced = asyncio.Event()
        self._lane = workers.Lane("api")
        self._turn = asyncio.Lock()
        self.watch = ObjectWatch(client, node, self.on_watch_event, self.relist)

    async def api(self, fn: Callable[..., Any], *args: Any) -> Any:
        # The pass, the watch's list and the Events take turns on the one API thread.
        async with self._turn:
            try:
                return await self._lane.call(fn, *args, deadline=API_DEADLINE_S)
            except workers.Overdue as exc:
                raise ApiFailure("unavailable", str(exc)) from exc

    def version(self) -> str:
        return resource_version(self.live)

    def _set(self, obj: dict[str, Any] | None, spec: DevicesSpec | None = None) -> None:
        """Keep the object a write returned; `spec` is the spec it holds when we just wrote or kept it."""
        self.live = obj
        self.known = True
        self.watch.resume_from(resource_version(obj))
        self._versions.append(resource_version(obj))
        if obj is not None and spec is not None:
            self._parsed = (resource_version(obj), spec)
            obj.pop("spec", None)  # the parsed copy is the one kept: a big node's spec is megabytes as dicts

    def spec(self) -> DevicesSpec | None:
        """The live object's spec, parsed once per resourceVersion (None when absent or unparseable)."""
        version = resource_version(self.live)
        if self._parsed is None or self._parsed[0] != version:
            spec = publish.stored_spec(self.live) if self.live is not None else None
            self._parsed = (version, spec)
            if self.live is not None and spec is not None:
                self.live.pop("spec", None)
        return self._parsed[1]

    # --- listing and watching ------------------------------------------------------------------------

    async def relist(self) -> None:
        """List the object (one request): where the watch resumes from, and the object as it is."""
        try:
            obj, list_version = await self.api(self.client.list_one, self.node)
        except ApiFailure as exc:
            self.metrics.errors.labels(kind=exc.kind).inc()
            log.warning("could not list the devices object", extra={"node": self.node, "error": str(exc)})
            self.watch.since = ""
            return
        self.watch.since = list_version or resource_version(obj)
        if self.known and (
            resource_version(obj) in (resource_version(self.live), *self._versions)
            or (obj is None and self.live is None)
        ):
            return  # nothing we have not seen (a write of ours may even be newer than this list)
        self.live, self.known = obj, True
        self._versions.append(resource_version(obj))
        self.synced.set()

    async def relist_or_raise(self) -> None:
        obj, list_version = await self.api(self.client.list_one, self.node)
        self.live, self.known = obj, True
        self._versions.append(resource_version(obj))
        self.watch.since = list_version or resource_version(obj)

    def on_watch_event(self, event: dict[str, Any]) -> None:
        """Someone changed the object (or our own write came back): keep it, and decide again if it is new."""
        if self._writing:
            # Our write's own event can arrive before its answer does: judge it once the answer is in.
            self._held.append(event)
            return
        obj = event.get("object") or {}
        if event.get("type") == "DELETED":
            if self.live is None and self.known:
                return
            log.warning("the devices object was deleted; recreating it", extra={"node": self.node})
            self.live, self.known = None, True
        else:
            if self.known and resource_version(obj) in (resource_version(self.live), *self._versions):
                return
            self.live, self.known = obj, True
        self.metrics.watch_events.inc()
        self.synced.set()

    # --- writing -------------------------------------------------------------------------------------

    async def apply(
        self, stored: dict[str, Any] | None, plan: publish.Plan, parsed: DevicesSpec | None
    ) -> tuple[list[str], DevicesSpec | None]:
        """Write what the plan says; returns what was written and the spec the object now holds (None when
        the stored one does not parse and was left as it is). Every write's answer becomes `live`."""
        if not plan.writes and (stored is None or _has_node_owner(stored, self.node)):
            if plan.desired is not None and stored is not None:
                # Equal to what is stored: keep the fresh copy (the one consumers hold), drop the parsed one.
                self._parsed = (resource_version(stored), plan.desired)
                return [], plan.desired
            return [], parsed
        self._writing = True
        try:
            return await self._write(stored, plan, parsed)
        finally:
            self._writing = False
            held, self._held = self._held, []
            for event in held:
                self.on_watch_event(event)

    async def _write(
        self, stored: dict[str, Any] | None, plan: publish.Plan, parsed: DevicesSpec | None
    ) -> tuple[list[str], DevicesSpec | None]:
        node = self.node
        wrote: list[str] = []
        final: DevicesSpec | None
        if stored is None:
            assert plan.spec is not None
            uid = await self.api(self.client.node_uid, node)
            obj = await self.api(self.client.create, node, plan.spec.wire(), owner_reference(node, uid))
            self._set(obj, plan.spec)
            self.metrics.api_writes.labels(kind="create").inc()
            wrote.append("create")
            final = plan.spec
        else:
            obj = stored
            owners = await self._owners(stored)
            final = plan.spec or plan.desired or parsed
            if plan.spec is not None or owners is not None:
                spec_wire = plan.spec.wire() if plan.spec is not None else None
                obj = await self.api(self.client.patch_spec, node, resource_version(obj), spec_wire, owners)
                self._set(obj, final)
                self.metrics.api_writes.labels(kind="spec").inc()
                wrote.append("spec")
        if plan.conditions is not None or plan.summary is not None:
            # Status is written after spec, preconditioned on the version that write returned.
            obj = await self.api(
                self.client.patch_status, node, resource_version(obj), plan.conditions, plan.summary
            )
            self._set(obj, final)
            self.metrics.api_writes.labels(kind="status").inc()
            wrote.append("status")
        return wrote, final

    async def _owners(self, stored: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The ownerReferences to write when the object is not owned by this Node (created by hand or by
        an older agent), so deleting the Node still removes it; None when it already is. Another Node's
        reference (a record copied from that node's) goes: while that Node lived, the record would
        outlive its own (garbage collection deletes it only when every owner is gone)."""
        if _has_node_owner(stored, self.node):
            return None
        owners = [o for o in _owner_references(stored) if isinstance(o, dict) and not _is_node(o)]
        uid = await self.api(self.client.node_uid, self.node)
        return [*owners, owner_reference(self.node, uid)]


def _owner_references(obj: dict[str, Any]) -> list[Any]:
    owners = metadata(obj).get("ownerReferences")
    return owners if isinstance(owners, list) else []


def _is_node(owner: dict[str, Any]) -> bool:
    return owner.get("kind") == "Node" and owner.get("apiVersion") == "v1"


def _has_node_owner(obj: dict[str, Any], node: str) -> bool:
    """Whether `node` (by name) owns the object; another Node owning it says nothing about this one."""
    return any(isinstance(o, dict) and _is_node(o) and o.get("name") == node for o in _owner_references(obj))
