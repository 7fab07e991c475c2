"""Kueue and KAI Topologies of ours under another name than the one now configured (`--topology-name`
changed, say by a `helm upgrade`): removed at start and at each resync, so a renamed Topology does not
stay behind for ever. Only objects provably ours go: our managed-by label and an owner reference naming
our owner's uid (a label alone anyone can copy), each deleted at the resourceVersion it was listed at.
Synchronous: the shell runs a pass in a worker thread."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import kubernetes

from nodefabric_devicemanager.nodeclient.objects import resource_version
from nodefabric_operator import events
from nodefabric_operator.rawcall import status_of
from nodefabric_operator.topology import project, report
from nodefabric_operator.topology.objects import API_ERRORS, Objects, brief, name_of

log = logging.getLogger(__name__)


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Ours beyond doubt: our label, and an owner reference naming our owner's uid."""
    meta = obj.get("metadata")
    refs = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    return (
        project.is_managed(obj)
        and isinstance(refs, list)
        and any(isinstance(r, Mapping) and r.get("uid") == uid for r in refs)
    )


def _conflict(err: BaseException) -> bool:
    return isinstance(err, kubernetes.client.ApiException) and status_of(err) == 409


class Sweeper:
    def __init__(
        self,
        objects: Objects,
        name: str,
        owner_uid: Callable[[], str | None],
        event: Callable[[events.Notice], None],
        again: Callable[[], None],
    ) -> None:
        self.objects = objects
        self.name = name  # the Topology name now configured: never swept
        self.owner_uid = owner_uid
        self.event = event
        self.again = again
        self._swept: set[str] = set()  # targets swept since the start or the last resync
        self._refused: set[str] = set()  # targets whose list was refused (403), said once

    def forget(self) -> None:
        self._swept.clear()

    def sweep(self, target: str) -> None:
        """Once per start and resync per target. Without an owner uid nothing is provably ours, and
        nothing is removed. A failure is said and retried with the pass's backoff; it never keeps the
        configured Topology from being written."""
        if target in self._swept:
            return
        uid = self.owner_uid()
        if not uid:
            self._swept.add(target)
            return
        try:
            changed = self._remove_others(target, uid)
        except API_ERRORS as err:
            if status_of(err) == 403:
                # No right to list or delete (a chart from before this rule): no retry, said once.
                self._swept.add(target)
                if target not in self._refused:
                    self._refused.add(target)
                    log.warning(
                        "cannot list or delete Topologies: those of an earlier --topology-name stay",
                        extra={"target": target, "error": brief(err)},
                    )
                return
            self.again()
            log.warning(
                "cannot remove Topologies of an earlier name",
                extra={"target": target, "error": brief(err)},
            )
            return
        if changed:
            self.again()  # listed again with the pass's backoff, not only at the next resync
            return
        self._swept.add(target)

    def _remove_others(self, target: str, uid: str) -> bool:
        """Whether one changed between its listing and its delete (listed again, and checked again)."""

        def ours(obj: dict[str, Any]) -> bool:
            return owned_by(obj, uid)

        changed = False
        for item in self.objects.labelled(target):
            name = name_of(item)
            if name == self.name or not ours(item) or project.held_by(item) is not None:
                # Being deleted already, kept by its finalizers (Kueue's while a ResourceFlavor still names
                # it): deleted and said once, not again at every resync.
                continue
            deleted = self._delete_at(target, name, resource_version(item))
            if deleted is not True:
                changed = changed or deleted is None
                continue
            log.info(
                "deleted a Topology of an earlier name",
                extra={"target": target, "object": name, "now": self.name},
            )
            self.event(
                events.Notice(
                    events.NORMAL,
                    report.REMOVED,
                    f"{target} Topology {name} deleted: nodefabric writes its topology as {self.name} now",
                )
            )
        return changed

    def _delete_at(self, target: str, name: str, version: str) -> bool | None:
        """Deleted at the version listed (True), never read again: the chart grants get on the configured
        name only (list and delete on any), so a read of an earlier name is refused. One listed without a
        version is left (False); one changed since (409: replaced, relabelled, or only its status
        written) is left to the next list, which says again whether it is still ours (None)."""
        if not version:
            log.warning(
                "a Topology of an earlier name was listed without a resourceVersion: not deleted",
                extra={"target": target, "object": name},
            )
            return False
        try:
            self.objects.delete(target, name, version)
        except API_ERRORS as err:
            if not _conflict(err):
                raise
            return None
        return True
