"""This node's ResourceSlices of our driver as the API server last told us: by a list, by the answer to
one of our writes, or by a watch event. The publisher plans against this copy, so deciding that nothing
changed costs no request; the watch tells it when someone else (kubelet, a human) changed a slice.

Thread-safe: syncs run on a worker thread, watch events arrive on the event loop.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from nodefabric_devicemanager.nodeclient import resource_version
from nodefabric_deviceplugin.dra.slices import LiveSlice, live_slice

# Versions we wrote or listed recently. A watch event carrying one is our own news coming back (it can
# arrive after a later write of ours); resourceVersions are opaque, so they are matched, never ordered.
KNOWN_VERSIONS = 256


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else ""


class LiveSlices:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[str, dict[str, Any]] = {}
        self._known: collections.deque[str] = collections.deque(maxlen=KNOWN_VERSIONS)
        self._listed = False

    @property
    def listed(self) -> bool:
        """Whether the copy is complete (a list filled it and nothing made it doubtful since)."""
        return self._listed

    def replace(self, items: Iterable[Mapping[str, Any]]) -> None:
        """What a list returned: the whole truth at the list's resourceVersion."""
        objects = {_name(o): dict(o) for o in items if _name(o)}
        with self._lock:
            self._objects = objects
            self._known.extend(resource_version(o) for o in objects.values())
            self._listed = True

    def forget(self) -> None:
        """The copy is doubtful (a write found a slice changed under us): the next sync lists first."""
        self._listed = False

    def wrote(self, obj: Mapping[str, Any]) -> None:
        """The object a create or an update of ours returned."""
        name = _name(obj)
        if not name:
            return
        copy = dict(obj)
        with self._lock:
            self._objects[name] = copy
            self._known.append(resource_version(copy))

    def removed(self, name: str) -> None:
        with self._lock:
            self._objects.pop(name, None)

    def apply(self, event: Mapping[str, Any]) -> bool:
        """A watch event. True when it is news: a change we neither made nor saw, worth a sync."""
        obj = event.get("object")
        if not isinstance(obj, dict):
            return False
        name, version = _name(obj), resource_version(obj)
        if not name:
            return False
        with self._lock:
            current = self._objects.get(name)
            if event.get("type") == "DELETED":
                if current is None:
                    return False  # our own delete coming back, or one we never knew of
                del self._objects[name]
                return True
            if version and (version in self._known or version == resource_version(current)):
                return False
            self._objects[name] = obj
            self._known.append(version)
            return True

    def slices(self) -> list[LiveSlice]:
        with self._lock:
            objects = list(self._objects.values())
        return [s for s in map(live_slice, objects) if s is not None]
