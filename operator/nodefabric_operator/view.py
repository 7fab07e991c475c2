"""What the operator knows of the objects it publishes to, without asking the API server.

The sink objects (NodeFeatures, or Nodes) are watched; the view holds a small snapshot of each (only our
label keys and what ownership needs), fed by the watch and by the answers to our own writes, whichever is
newer. Planning against it is what lets a first sync cost one write per record and a restart or a watch
replay cost none: nothing is read back that the watch already delivered.

"Newer" compares resourceVersions as numbers. Kubernetes documents them as opaque, but every API server
backed by etcd hands out one cluster-wide increasing revision, and comparing them is the only way to
tell a replayed event from a new one; a version that is not a plain number is only ever equal.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

_REVISION = re.compile(r"0|[1-9][0-9]{0,19}", re.ASCII)


def part(obj: object, *path: str) -> Mapping[str, Any]:
    """obj[path...] when every step is a mapping, else an empty one: a watched object's fields are read
    through this, so an object of the wrong shape (a hand edit, a newer API) plans as empty, not a crash."""
    for key in path:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    return obj if isinstance(obj, Mapping) else {}


def items(obj: object, *path: str) -> list[Mapping[str, Any]]:
    """The mappings in the list at obj[path...]; anything else there is skipped."""
    *head, last = path
    value = part(obj, *head).get(last)
    return [i for i in value if isinstance(i, Mapping)] if isinstance(value, list) else []


def version(obj: object) -> str | None:
    """metadata.resourceVersion as text, or None."""
    rv = part(obj, "metadata").get("resourceVersion")
    return str(rv) if isinstance(rv, str | int) and not isinstance(rv, bool) else None


def _revision(rv: str | None) -> int | None:
    return int(rv) if rv is not None and _REVISION.fullmatch(rv) else None


def at_or_below(rv: str | None, seen: str | None) -> bool:
    """Whether a body at `rv` carries nothing newer than the one at `seen` (None: never seen)."""
    if rv is None or seen is None:
        return False
    a, b = _revision(rv), _revision(seen)
    if a is None or b is None:
        return rv == seen
    return a <= b


@dataclass(frozen=True, slots=True)
class SinkObject:
    """A sink object as far as planning needs it. `labels` holds only our domain's `rdma.`/`fabric.`
    keys: no other key is ever planned or written, so keeping the rest would only cost memory."""

    name: str
    rv: str | None
    labels: Mapping[str, str] = field(default_factory=dict)
    owners: frozenset[str] = frozenset()  # uids in ownerReferences (NodeFeature)
    tagged: bool = True  # carries the node-name label nfd-master selects by (NodeFeature)
    # Another writer's owner ("Pod nfd-worker-x7", sinks.foreign_owner): nfd-worker names its
    # NodeFeature after the node too, so in NFD's own namespace the object of our name is its own.
    foreign: str = ""
    managed: frozenset[str] | None = None  # keys we wrote, from our annotation (Node)


class SinkView:
    """Sink objects by node name. Not thread-safe: only the operator's event loop touches it."""

    def __init__(self) -> None:
        self._objects: dict[str, SinkObject] = {}
        self._deleted: set[str] = set()
        # node -> the version its deletion was delivered at, while its record exists: the answer to a
        # write made before that deletion can reach the view after it (a publish in a worker thread
        # while the watch delivers the DELETED event), and must not make the object exist again.
        self._gone: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._objects)

    def get(self, name: str) -> SinkObject | None:
        return self._objects.get(name)

    def names(self) -> list[str]:
        return list(self._objects)

    def observe(self, obj: SinkObject) -> bool:
        """Hold `obj` unless what is held is as new; True when it replaced something older (or nothing)."""
        held = self._objects.get(obj.name)
        if held is not None and at_or_below(obj.rv, held.rv):
            return False
        gone = self._gone.get(obj.name)
        if gone is not None and at_or_below(obj.rv, gone):
            return False  # deleted since: still deleted
        self._objects[obj.name] = obj
        self._deleted.discard(obj.name)
        self._gone.pop(obj.name, None)
        return True

    def forget(self, name: str, rv: str | None, *, remember: bool) -> bool:
        """The watch says the object at `rv` was deleted. Kept when we already hold a newer one (we
        recreated it before the deletion was delivered). `remember`: note the deletion for
        `was_deleted` (only while its record exists, so deleted nodes leave nothing behind). True when
        it was dropped."""
        held = self._objects.get(name)
        if held is not None and rv is not None and not at_or_below(held.rv, rv):
            return False
        self._objects.pop(name, None)
        if remember:
            self._deleted.add(name)
            if rv is not None:
                self._gone[name] = rv
        return True

    def clear_deleted(self, name: str) -> None:
        """The node's record is gone: a later record for it starts without the deletion note."""
        self._deleted.discard(name)
        self._gone.pop(name, None)

    def was_deleted(self, name: str) -> bool:
        """Whether the watch saw this node's object deleted and nothing has replaced it since: creating it
        again may race the deletion of its Devices record, so that create checks the record first."""
        return name in self._deleted
