"""Volcano's HyperNodes: one object per level value, ours listed once and then kept in step (created,
patched, deleted) with what the hierarchy yields. A name some other HyperNode holds is left to it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kubernetes

from nodefabric_devicemanager.nodeclient.objects import resource_version
from nodefabric_operator.rawcall import status_of
from nodefabric_operator.topology import project
from nodefabric_operator.topology.nesting import Hierarchy
from nodefabric_operator.topology.objects import NotOurs, Objects

log = logging.getLogger(__name__)

TARGET = project.VOLCANO


class HyperNodeWriter:
    def __init__(self, objects: Objects) -> None:
        self.objects = objects
        self._taken: frozenset[str] = frozenset()  # HyperNode names held by HyperNodes we do not manage
        self._versions: dict[str, str] = {}  # ours: name -> resourceVersion as last listed or written

    def write(self, hierarchy: Hierarchy, fleet: Mapping[str, Mapping[str, str]]) -> str:
        if TARGET not in self.objects.known:
            self.objects.known[TARGET], self._taken = self._list()
        taken = set(self._taken)
        state = self._write(project.hypernodes(hierarchy, fleet, taken=self._taken))
        if self._taken != taken:
            # A name met taken on create: its parent was built naming it, so build once more without it.
            state = self._write(project.hypernodes(hierarchy, fleet, taken=self._taken))
        if self._taken:
            wanted = project.hypernodes(hierarchy, fleet)
            held = sorted(n for n in self._taken if n in wanted)
            if held:
                shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
                state += f"; left out, their names held by HyperNodes not managed by nodefabric: {shown}"
        return state

    def _list(self) -> tuple[dict[str, Any], frozenset[str]]:
        """Ours (name -> spec) and the names every other HyperNode holds."""
        ours: dict[str, Any] = {}
        theirs: set[str] = set()
        self._versions = {}
        for i in self.objects.items(TARGET):
            name = str(i["metadata"]["name"])
            if project.is_managed(i):
                ours[name] = i.get("spec")
                self._versions[name] = resource_version(i)
            else:
                theirs.add(name)
        return ours, frozenset(theirs)

    def _write(self, desired: Mapping[str, dict[str, Any]]) -> str:
        known: dict[str, Any] = self.objects.known[TARGET]
        written = 0
        for name, body in desired.items():
            if name not in known:
                if not self._create(name, body):
                    continue
            elif known[name] != body["spec"]:
                try:
                    # Deleted since we wrote it: written again.
                    self._versions[name] = self.objects.update(TARGET, name, body)
                except NotOurs:
                    # Ours deleted and someone else's made under the name since: theirs stays.
                    del known[name]
                    self._taken = self._taken | {name}
                    continue
            else:
                continue
            known[name] = body["spec"]
            written += 1
        for name in sorted(set(known) - set(desired)):
            del known[name]
            written += 1
            # Only ours, as we last saw it: theirs (made under the name, or ours unlabelled) stays.
            if not self.objects.delete_ours(TARGET, name, self._versions.pop(name, "")):
                self._taken = self._taken | {name}
        if written:
            log.info("hypernodes written", extra={"objects": len(desired), "written": written})
        return f"{len(desired)} HyperNodes"

    def _create(self, name: str, body: dict[str, Any]) -> bool:
        """Created, or ours already (its spec written): True. False when someone else's holds the name."""
        try:
            self._versions[name] = self.objects.create(TARGET, body)
        except kubernetes.client.ApiException as err:
            if status_of(err) != 409:
                raise
            live = self.objects.get(TARGET, name)
            if live is not None and not project.is_managed(live):
                self._taken = self._taken | {name}  # someone else's HyperNode of that name
                return False
            try:
                self._versions[name] = self.objects.update(TARGET, name, body)
            except NotOurs:
                self._taken = self._taken | {name}  # theirs made between our read and our patch
                return False
        return True
