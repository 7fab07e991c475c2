"""This node's ResourceSlices of our driver as the API server last told us: by a list, by the answer to
one of our writes, or by a watch event. The publisher plans against this copy, so deciding that nothing
changed costs no request; the watch tells it when someone else (kubelet, a human) changed a slice. Each
slice is kept as its name, resourceVersion, generation and a digest of its content (`slices.LiveSlice`),
not as the object: an 8 PF x 128 VF node's slices are about 3 MiB as dicts.

Thread-safe: syncs run on a worker thread, watch events arrive on the event loop. A watch event costs the
loop no digest: our own writes coming back (every record change brings one per slice written) are told
by their resourceVersion alone, and a slice someone else changed is kept with its spec, digested by the
next sync on its thread (`slices`), which the event triggers.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from nodefabric_deviceplugin.dra.slices import LiveSlice, content, live_slice

# Versions we wrote or listed recently. A watch event carrying one is our own news coming back (it can
# arrive after a later write of ours); resourceVersions are opaque, so they are matched, never ordered.
KNOWN_VERSIONS = 256
CHANGES = ("ADDED", "MODIFIED")


class LiveSlices:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slices: dict[str, LiveSlice] = {}
        self._known: collections.deque[str] = collections.deque(maxlen=KNOWN_VERSIONS)
        self._listed = False
        # Slices a watch event brought, by name: their entry in `_slices` (its content None) and the spec
        # whose digest `slices` computes off the loop.
        self._undigested: dict[str, tuple[LiveSlice, Any]] = {}

    @property
    def listed(self) -> bool:
        """Whether the copy is complete (a list filled it and nothing made it doubtful since)."""
        return self._listed

    def replace(self, items: Iterable[Mapping[str, Any]]) -> None:
        """What a list returned: the whole truth at the list's resourceVersion."""
        found = {s.name: s for s in map(live_slice, items) if s is not None}
        with self._lock:
            for name, listed in found.items():
                kept = self._slices.get(name)
                if kept is not None and kept.written_as and _same_object(kept, listed):
                    # Still the API server's answer to our write: listed, it must not read as drift.
                    found[name] = dataclasses.replace(listed, written_as=kept.written_as)
            self._slices = found
            self._undigested.clear()
            self._known.extend(s.resource_version for s in found.values())
            self._listed = True

    def forget(self) -> None:
        """The copy is doubtful (a write found a slice changed under us): the next sync lists first."""
        self._listed = False

    def wrote(self, obj: Mapping[str, Any], desired: str | None = None) -> None:
        """The object a create or an update of ours returned; `desired`: the `content` of what we sent."""
        written = live_slice(obj)
        if written is None:
            return
        if desired is not None and written.content != desired:
            written = dataclasses.replace(written, written_as=desired)
        with self._lock:
            self._slices[written.name] = written
            self._undigested.pop(written.name, None)
            self._known.append(written.resource_version)

    def removed(self, name: str) -> None:
        with self._lock:
            self._slices.pop(name, None)
            self._undigested.pop(name, None)

    def apply(self, event: Mapping[str, Any]) -> bool:
        """A watch event. True when it is news: a change we neither made nor saw, worth a sync."""
        obj = event.get("object")
        kind = event.get("type")
        # No digest here, on the loop: most events are our own writes coming back, and need none.
        seen = (
            live_slice(obj, digest=False) if isinstance(obj, dict) and kind in (*CHANGES, "DELETED") else None
        )
        if seen is None:
            return False
        with self._lock:
            current = self._slices.get(seen.name)
            if kind == "DELETED":
                if current is None:
                    return False  # our own delete coming back, or one we never knew of
                del self._slices[seen.name]
                self._undigested.pop(seen.name, None)
                return True
            version = seen.resource_version
            if version and (version in self._known or (current and version == current.resource_version)):
                return False
            self._slices[seen.name] = seen
            self._undigested[seen.name] = (seen, obj.get("spec") if isinstance(obj, dict) else None)
            self._known.append(version)
            return True

    def slices(self) -> list[LiveSlice]:
        """The slices, each with its digest: those a watch event brought are digested here, on the
        sync's thread, outside the lock (events go on arriving meanwhile; one that replaced a slice
        being digested is digested in turn)."""
        while True:
            with self._lock:
                pending = list(self._undigested.items())
                if not pending:
                    return list(self._slices.values())
            done = [
                (name, seen, dataclasses.replace(seen, content=content(spec)))
                for name, (seen, spec) in pending
            ]
            with self._lock:
                for name, seen, digested in done:
                    held = self._undigested.get(name)
                    if held is not None and held[0] is seen:
                        del self._undigested[name]
                        self._slices[name] = digested


def _same_object(a: LiveSlice, b: LiveSlice) -> bool:
    return bool(a.resource_version) and (a.resource_version, a.content) == (b.resource_version, b.content)
