"""The one Topology object Kueue or KAI reads: written when its levels change, patched where the target
allows it, deleted and created again where its levels cannot change in place."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import kubernetes

from nodefabric_devicemanager.nodeclient.objects import resource_version
from nodefabric_operator import events
from nodefabric_operator.rawcall import status_of
from nodefabric_operator.topology import project, report
from nodefabric_operator.topology.objects import NotOurs, Objects, held_state

log = logging.getLogger(__name__)


class TopologyWriter:
    def __init__(
        self, objects: Objects, event: Callable[[events.Notice], None], again: Callable[[], None]
    ) -> None:
        self.objects = objects
        self.event = event
        self.again = again  # a pass is due again later (a write failed, or is held)
        self._replacing: dict[str, tuple[str, ...]] = {}  # target -> levels of the one deleted to be replaced
        self._versions: dict[str, str] = {}  # target -> resourceVersion of ours as last read or written

    def write(self, target: str, body: dict[str, Any]) -> str:
        known = self.objects.known
        name = body["metadata"]["name"]
        desired = project.levels_of(body) or ()
        if target not in known:
            live = self.objects.get(target, name)
            if live is not None and not project.is_managed(live):
                plural = self.objects.gvp(target)[2]
                return f"{plural} {name} exists and is not managed by nodefabric: left alone"
            held = project.held_by(live)
            if held is not None:
                # Being deleted (by us to replace it, or by someone), kept by its finalizers (Kueue's while a
                # ResourceFlavor names it): nothing can be written under its name until it is gone.
                self.again()
                return held_state(body["kind"], name, held)
            known[target] = project.levels_of(live)
            self._versions[target] = resource_version(live)
        action = project.topology_action(
            known[target], desired, mutable_with_hostname=target == project.KUEUE
        )
        # The state names the result, not the action, so the report does not change back and forth.
        state = f"{body['kind']} {name}: {len(desired)} levels"
        if action == project.NONE:
            return state
        if action == project.UPDATE:
            try:
                # Deleted since we wrote it: written again.
                self._versions[target] = self.objects.update(target, name, body)
            except NotOurs as err:
                known.pop(target, None)  # read again next pass, and left alone while it is theirs
                return f"{err}: left alone"
        else:
            if action == project.REPLACE:
                # Only ours, as we last saw it: theirs (made under the name, or ours unlabelled) stays.
                if not self.objects.delete_ours(target, name, self._versions.get(target, "")):
                    known.pop(target, None)
                    plural = self.objects.gvp(target)[2]
                    return f"{plural} {name} exists and is not managed by nodefabric: left alone"
                self._replacing[target] = tuple(known[target] or ())
                known[target] = None
            try:
                self._versions[target] = self.objects.create(target, body)
            except kubernetes.client.ApiException as err:
                if status_of(err) != 409 or target not in self._replacing:
                    raise
                return self._held(target, body)
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
        known[target] = desired
        log.info("topology written", extra={"target": target, "object": name, "action": action})
        return state

    def _held(self, target: str, body: dict[str, Any]) -> str:
        """The delete was accepted but the object stays until its finalizers go: said once, and the create
        is retried (the next pass reads it again) rather than the delete repeated."""
        name = body["metadata"]["name"]
        self.objects.known.pop(target, None)
        self.again()
        held = project.held_by(self.objects.get(target, name)) or "[]"
        self.event(
            events.Notice(
                events.WARNING,
                report.REPLACE_PENDING,
                f"{target} {body['kind']} {name} deleted to be replaced (its levels cannot change "
                f"in place) but held by finalizers {held}: written once it is gone",
            )
        )
        return held_state(body["kind"], name, held)
