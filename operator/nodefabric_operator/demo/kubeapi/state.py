"""What the embedded API holds, and the one path every write takes into it: a resourceVersion from one
counter, generation bumped when content changed, an event in the resource's log and on its watch hub,
finalizers, garbage collection by owner uid, and the types a stored CRD serves.

`Objects` is what the request handlers (`reads`, `writes`, `subresources`) and the seeding methods of
`KubeAPI` (`put_object`, `remove_object`, `clear_objects`) share; none of them stores anything itself."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Mapping
from typing import Any

from nodefabric_operator.demo.kubeapi import errors, pods
from nodefabric_operator.demo.kubeapi.admission import CRDS, NAMESPACES, admit, content, crd_status, now
from nodefabric_operator.demo.kubeapi.catalogue import Catalogue, ResourceType, crd_types
from nodefabric_operator.demo.kubeapi.knobs import Knobs
from nodefabric_operator.demo.kubeapi.store import Event, EventLog, Hub, Store, key_of, meta
from nodefabric_operator.demo.kubeapi.validation import required

SYSTEM_NAMESPACES = ("default", "kube-node-lease", "kube-public", "kube-system")  # every cluster has them
PODS = "v1/pods"


class Objects:
    """The store, the served types, the resourceVersion counter, each resource's event log and hub."""

    def __init__(self, catalogue: Catalogue, store: Store, knobs: Knobs) -> None:
        self.catalogue = catalogue
        self.store = store
        self._knobs = knobs
        self.rv = 0
        self._logs: dict[str, EventLog] = {}
        self._hubs: dict[str, Hub] = {}

    def next_resource_version(self) -> str:
        self.rv += 1
        return str(self.rv)

    def existing(self, rt: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        """The stored object a request names; raises the API server's 404 Status when there is none."""
        obj = self.store.get(rt.key, namespace, name)
        if obj is None:
            raise errors.not_found(rt.plural, rt.group, name)
        return obj

    def log(self, resource: str) -> EventLog:
        log = self._logs.get(resource)
        if log is None:
            log = self._logs[resource] = EventLog(self._knobs.event_window)
        return log

    def hub(self, resource: str) -> Hub:
        hub = self._hubs.get(resource)
        if hub is None:
            hub = self._hubs[resource] = Hub()
        return hub

    # --- seeding (tests, the demo) --------------------------------------------------------------------

    def put(self, key: str, obj: dict[str, Any], *, validate: bool = True) -> dict[str, Any]:
        """`KubeAPI.put_object`: create or replace an object directly, validated unless told not to."""
        rt = self.catalogue.by_key(key)
        if rt is None:
            raise errors.no_such_resource()
        body = copy.deepcopy(obj)
        m = body.setdefault("metadata", {})
        if not isinstance(m, dict) or not isinstance(m.get("name"), str) or not m["name"]:
            raise errors.invalid(rt.kind, rt.group, "", [required("metadata.name")])
        old = self.store.get(rt.key, m.get("namespace"), m.get("name") or "")
        server = {k: v for k, v in meta(old or {}).items() if k in ("uid", "creationTimestamp", "generation")}
        m.update({k: m.get(k) or v for k, v in server.items()})
        m.setdefault("uid", str(uuid.uuid4()))
        m.setdefault("creationTimestamp", now())
        m.setdefault("generation", 1)
        m.pop("resourceVersion", None)
        if validate:
            body, _ = admit(rt, body, namespace=m.get("namespace"), params={}, old=old)
            causes = pods.create_causes(body) if rt.key == PODS and old is None else []
            if causes:
                raise errors.invalid(rt.kind, rt.group, m["name"], causes)
        else:
            body.update({"apiVersion": rt.group_version, "kind": rt.kind})
        stored = self.commit(rt, body, old)
        obj.setdefault("metadata", {}).update(
            {k: meta(stored)[k] for k in ("uid", "creationTimestamp", "resourceVersion")}
        )
        return obj

    def remove_object(self, key: str, name: str, namespace: str | None = None) -> None:
        rt = self.catalogue.by_key(key)
        obj = None if rt is None else self.store.get(rt.key, namespace, name)
        if rt is not None and obj is not None:
            self.remove(rt, obj, "Background")

    def clear(self) -> None:
        """Delete every object (watches see them go) except the CRDs served and the system namespaces."""
        for resource, obj in list(self.store.items()):
            ns, name = key_of(obj)
            if resource == CRDS or (resource == NAMESPACES and name in SYSTEM_NAMESPACES):
                continue
            if self.store.get(resource, ns or None, name) is not None:
                self.remove_object(resource, name, ns or None)

    def close_watches(self, *, expired: bool = False) -> int:
        closed = 0
        for hub in self._hubs.values():
            for watcher in list(hub.watchers):
                watcher.close(expired=expired)
                closed += 1
        return closed

    def compact(self) -> None:
        for log in self._logs.values():
            log.compact(self.rv)

    # --- the write path -------------------------------------------------------------------------------

    def commit(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
        """Store an admitted object: a new resourceVersion, generation when its content changed, an
        event for watches. A write that changes nothing stores nothing and notifies nobody."""
        if rt.key == CRDS:
            obj = {**obj, "status": crd_status(obj)}
        m = dict(obj["metadata"])
        if old is not None:
            old_m = meta(old)
            m["generation"] = old_m.get("generation", 1)
            if content(old, rt) != content(obj, rt):
                m["generation"] = int(old_m.get("generation", 1)) + 1
            m["resourceVersion"] = old_m.get("resourceVersion")
            if {**obj, "metadata": m} == old:
                return old
        m["resourceVersion"] = self.next_resource_version()
        obj = {**obj, "metadata": m}
        if m.get("deletionTimestamp") and not m.get("finalizers"):
            self.store.put(rt.key, obj)  # the last finalizer went: the deletion it waited for happens
            return self.remove(rt, obj, "Background")
        self.store.put(rt.key, obj)
        self._emit(rt, Event(self.rv, "ADDED" if old is None else "MODIFIED", obj, old))
        if rt.key == CRDS:
            self._declare_types(obj)
        return obj

    def remove(self, rt: ResourceType, obj: dict[str, Any], propagation: str) -> dict[str, Any]:
        m = meta(obj)
        self.store.remove(rt.key, m.get("namespace"), m["name"])
        gone = {**obj, "metadata": {**m, "resourceVersion": self.next_resource_version()}}
        self._emit(rt, Event(self.rv, "DELETED", gone))
        if rt.key == CRDS:
            for served in self.catalogue.remove_crd(m["name"]):
                for item in list(self.store.select(served.key)):
                    self.remove(served, item, "Background")
                for watcher in list(self.hub(served.key).watchers):
                    watcher.close()
        if rt.key == NAMESPACES:
            for other in self.catalogue:
                if other.namespaced:
                    for item in list(self.store.select(other.key, m["name"])):
                        self.remove(other, item, "Background")
        if m.get("uid"):
            self._collect(m["uid"], propagation)
        return gone

    def mark_deleted(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        if meta(obj).get("deletionTimestamp"):
            return obj
        m = {**meta(obj), "deletionTimestamp": now(), "deletionGracePeriodSeconds": 0}
        return self.commit(rt, {**obj, "metadata": m}, obj)

    def delete(
        self, rt: ResourceType, obj: dict[str, Any], propagation: str = "Background"
    ) -> dict[str, Any]:
        """A delete as the API answers it: marked while finalizers remain, else removed."""
        if meta(obj).get("finalizers"):
            return self.mark_deleted(rt, obj)
        return self.remove(rt, obj, propagation)

    def _emit(self, rt: ResourceType, event: Event) -> None:
        self.log(rt.key).append(event)
        hub = self._hubs.get(rt.key)
        if hub is not None:
            hub.publish(event)

    def _collect(self, uid: str, propagation: str) -> None:
        """Garbage collection: a dependent whose owners are all gone goes too (or, with Orphan, only
        loses its reference); one that still has a live owner only loses the dangling reference."""
        for resource, dependent in self.store.dependents(uid):
            rt = self.catalogue.by_key(resource)
            if rt is None:
                continue
            refs = meta(dependent).get("ownerReferences") or []
            alive = [
                r for r in refs if r.get("uid") != uid and self.store.by_uid(r.get("uid", "")) is not None
            ]
            if propagation == "Orphan" or alive:
                kept = [r for r in refs if r.get("uid") != uid]
                m = {**meta(dependent), "ownerReferences": kept}
                if not kept:
                    del m["ownerReferences"]
                self.commit(rt, {**dependent, "metadata": m}, dependent)
            elif meta(dependent).get("finalizers"):
                self.mark_deleted(rt, dependent)
            else:
                self.remove(rt, dependent, propagation)

    def _declare_types(self, crd: Mapping[str, Any]) -> None:
        name = crd.get("metadata", {}).get("name", "")
        self.catalogue.remove_crd(name)  # an updated CRD replaces its versions; open watches go on
        for rt in crd_types(crd):
            self.catalogue.add(rt)
