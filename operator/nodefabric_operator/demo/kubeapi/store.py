"""Objects by resource, namespace and name, with the indexes a fleet needs, and their watch events.

A request never scans more than it must: an object is found by its key, a list walks one resource's
objects in the API server's order (namespace, then name) and a label selector with an equality term
starts from the objects carrying that label. Owner references are indexed by uid, so garbage
collection finds dependents without a scan.

Every write gets a resource version from one counter (as etcd's revision) and becomes an event in its
resource's bounded log, so a watch can resume from a resource version it saw, and a resume from one
the log no longer holds is the API server's 410 Expired.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from nodefabric_operator.demo.kubeapi.selectors import FieldTerm, Requirement

Key = tuple[str, str]  # (namespace or "", name): the API server's storage order within a resource


def meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    m = obj.get("metadata")
    return m if isinstance(m, dict) else {}


def key_of(obj: Mapping[str, Any]) -> Key:
    m = meta(obj)
    return (m.get("namespace") or "", m["name"])


class Store:
    """The objects of every resource, by resource key ("group/version/plural") and (namespace, name)."""

    def __init__(self) -> None:
        self._objects: dict[str, dict[Key, dict[str, Any]]] = collections.defaultdict(dict)
        self._order: dict[str, list[Key]] = {}  # sorted keys, rebuilt lazily after inserts/removals
        self._labels: dict[str, dict[tuple[str, str], set[Key]]] = collections.defaultdict(
            lambda: collections.defaultdict(set)
        )
        self._label_keys: dict[str, dict[str, set[Key]]] = collections.defaultdict(
            lambda: collections.defaultdict(set)
        )
        self._uids: dict[str, tuple[str, Key]] = {}
        self._dependents: dict[str, set[tuple[str, Key]]] = collections.defaultdict(set)

    def get(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        return self._objects[resource].get((namespace or "", name))

    def by_uid(self, uid: str) -> tuple[str, dict[str, Any]] | None:
        found = self._uids.get(uid)
        if found is None:
            return None
        obj = self._objects[found[0]].get(found[1])
        return None if obj is None else (found[0], obj)

    def put(self, resource: str, obj: dict[str, Any]) -> dict[str, Any] | None:
        """Store `obj` (never mutated afterwards); the previous object under its key, if any."""
        key = key_of(obj)
        objects = self._objects[resource]
        old = objects.get(key)
        if old is not None:
            self._unindex(resource, key, old)
        else:
            self._order.pop(resource, None)
        objects[key] = obj
        self._index(resource, key, obj)
        return old

    def remove(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        key = (namespace or "", name)
        old = self._objects[resource].pop(key, None)
        if old is not None:
            self._unindex(resource, key, old)
            self._order.pop(resource, None)
        return old

    def _index(self, resource: str, key: Key, obj: Mapping[str, Any]) -> None:
        m = meta(obj)
        for k, v in (m.get("labels") or {}).items():
            self._labels[resource][k, v].add(key)
            self._label_keys[resource][k].add(key)
        if m.get("uid"):
            self._uids[m["uid"]] = (resource, key)
        for ref in m.get("ownerReferences") or []:
            if ref.get("uid"):
                self._dependents[ref["uid"]].add((resource, key))

    def _unindex(self, resource: str, key: Key, obj: Mapping[str, Any]) -> None:
        m = meta(obj)
        for k, v in (m.get("labels") or {}).items():
            self._labels[resource][k, v].discard(key)
            self._label_keys[resource][k].discard(key)
        if m.get("uid") and self._uids.get(m["uid"]) == (resource, key):
            del self._uids[m["uid"]]
        for ref in m.get("ownerReferences") or []:
            dependents = self._dependents.get(ref.get("uid", ""))
            if dependents is not None:
                dependents.discard((resource, key))
                if not dependents:
                    del self._dependents[ref["uid"]]

    def dependents(self, uid: str) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for resource, key in sorted(self._dependents.get(uid, ())):
            obj = self._objects[resource].get(key)
            if obj is not None:
                out.append((resource, obj))
        return out

    def _sorted(self, resource: str) -> list[Key]:
        order = self._order.get(resource)
        if order is None:
            order = self._order[resource] = sorted(self._objects[resource])
        return order

    def _candidates(self, resource: str, reqs: Iterable[Requirement]) -> list[Key] | None:
        """The smallest set an equality or existence term narrows the selection to (None: all)."""
        best: set[Key] | None = None
        for req in reqs:
            if req.op == "in":
                found: set[Key] = set()
                for value in req.values:
                    found |= self._labels[resource].get((req.key, value), set())
            elif req.op in ("exists", "gt", "lt"):
                found = self._label_keys[resource].get(req.key, set())
            else:
                continue
            if best is None or len(found) < len(best):
                best = found
        return None if best is None else sorted(best)

    def select(
        self,
        resource: str,
        namespace: str | None = None,
        labels: Iterable[Requirement] = (),
        fields: Iterable[FieldTerm] = (),
        after: Key | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Objects in storage order (after `after`, for a continued list) that match the selectors."""
        labels, fields = list(labels), list(fields)
        keys = self._candidates(resource, labels)
        if keys is None:
            keys = self._sorted(resource)
        start = 0
        if namespace:
            start = bisect.bisect_left(keys, (namespace, ""))
        if after is not None:
            start = max(start, bisect.bisect_right(keys, after))
        objects = self._objects[resource]
        for key in keys[start:]:
            if namespace and key[0] != namespace:
                break
            obj = objects.get(key)
            if obj is None:
                continue
            if labels and not all(r.matches(meta(obj).get("labels") or {}) for r in labels):
                continue
            if fields and not all(t.matches(obj) for t in fields):
                continue
            yield obj

    def count(self, resource: str) -> int:
        return len(self._objects[resource])

    def resources(self) -> list[str]:
        return [r for r, objs in self._objects.items() if objs]

    def items(self) -> Iterator[tuple[str, dict[str, Any]]]:
        for resource, objects in list(self._objects.items()):
            for obj in list(objects.values()):
                yield resource, obj


# --- events and watches -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    obj: dict[str, Any]
    old: dict[str, Any] | None = None


class EventLog:
    """One resource's recent events, oldest first, for watches that resume from a resource version."""

    def __init__(self, window: int) -> None:
        self._events: collections.deque[Event] = collections.deque(maxlen=window)
        self.evicted_through = 0  # the newest resource version no longer held

    def append(self, event: Event) -> None:
        if len(self._events) == self._events.maxlen:
            self.evicted_through = self._events[0].rv if self._events else event.rv
        self._events.append(event)

    def since(self, rv: int) -> list[Event] | None:
        """Events after `rv`, or None when some of them are gone (a resume must re-list)."""
        if rv < self.evicted_through:
            return None
        out: list[Event] = []
        for event in reversed(self._events):
            if event.rv <= rv:
                break
            out.append(event)
        out.reverse()
        return out

    def compact(self, through: int) -> None:
        self._events.clear()
        self.evicted_through = through


Filter = Callable[[Mapping[str, Any]], bool]


@dataclass(eq=False)
class Watcher:
    """One watch request: what it selects and the events waiting to be written to it."""

    matches: Filter
    capacity: int
    queue: collections.deque[tuple[str, dict[str, Any]] | None] = field(default_factory=collections.deque)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    overflowed: bool = False
    expired: bool = False

    def offer(self, event: Event) -> None:
        """Translate a storage event into what this watch sees, as the API server's watch cache does:
        an object that starts (stops) matching the selectors is ADDED (DELETED) for this watch."""
        now = self.matches(event.obj)
        if event.type == "MODIFIED" and event.old is not None:
            before = self.matches(event.old)
            kind = "MODIFIED" if (now and before) else "ADDED" if now else "DELETED" if before else ""
        else:
            kind = event.type if now else ""
        if kind:
            self.push(kind, event.obj)

    def push(self, kind: str, obj: dict[str, Any]) -> None:
        if len(self.queue) >= self.capacity:
            self.overflowed = True  # a watcher too slow to keep up is closed; the client resumes
        else:
            self.queue.append((kind, obj))
        self.wakeup.set()

    def close(self, *, expired: bool = False) -> None:
        self.expired = expired
        self.queue.append(None)
        self.wakeup.set()

    async def next(self, timeout: float) -> tuple[str, dict[str, Any]] | bool | None:
        """The next event, None when closed, False when `timeout` passed with nothing to send."""
        if not self.queue:
            self.wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wakeup.wait(), timeout)
        if self.overflowed:
            return None
        if not self.queue:
            return False
        return self.queue.popleft()


class Hub:
    """The open watches of one resource."""

    def __init__(self) -> None:
        self.watchers: set[Watcher] = set()

    @property
    def consumer_count(self) -> int:
        return len(self.watchers)

    def publish(self, event: Event) -> None:
        for watcher in list(self.watchers):
            watcher.offer(event)

    async def put(self, *items: Any) -> None:
        """Deliver raw `{"type": ..., "object": ...}` events to the open watches, bypassing storage:
        kmock's event-bus interface, which tests use to simulate what the API never stored."""
        for item in items:
            if isinstance(item, Mapping) and isinstance(item.get("object"), dict):
                for watcher in list(self.watchers):
                    if watcher.matches(item["object"]):
                        watcher.push(str(item.get("type", "MODIFIED")), item["object"])
