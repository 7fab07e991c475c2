"""What the placement controller writes besides the pods it releases: the PlacementGroup (created when
missing, its status only when it changed), Events, and the decision copied onto each pod.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from nodefabric_operator.admission import model, podview
from nodefabric_operator.admission.grouping import GroupView
from nodefabric_operator.admission.model import PlacementGroupStatus
from nodefabric_operator.admission.state import Tables, owns, pg_key
from nodefabric_operator.extender.events import KubePublisher
from nodefabric_operator.rawcall import status_body

log = logging.getLogger(__name__)

MAX_DECISION = 4096  # the decision as copied onto a pod's annotation
# A waiting group's decision changes with every pod that arrives ("3 of 64 exist"): a pod is told a new
# text of the same kind at most this often (the latest wins), or pods made one after another would cost
# about decisions x pods PATCHes. The PlacementGroup's status always has the current one.
DECISION_EVERY_S = 30.0


def names_object(exc: ApiException, name: str) -> bool:
    """A 404 Status about the object itself (its details name it), not about a path the server lacks."""
    details = status_body(exc).get("details")
    return isinstance(details, dict) and details.get("name") == name


class PlacementWriter:
    def __init__(
        self,
        custom: Any,
        tables: Tables,
        publisher: KubePublisher,
        decision_key: str,
        clock: Callable[[], float] = time.time,
        *,
        timeout: tuple[float, float],
    ) -> None:
        self.custom = custom
        self.timeout = timeout
        self.tables = tables
        self.publisher = publisher
        self.decision_key = decision_key
        self.clock = clock
        self.annotated: dict[str, str] = {}  # uid -> decision text last copied onto the pod
        self.annotated_at: dict[str, float] = {}  # uid -> when it was
        self.owed: dict[str, str] = {}  # uid -> a newer text of the same kind, held back until due
        self.kinds: dict[str, str] = {}  # uid -> the reason of the last Event about the pod
        tables.per_pod.extend((self.annotated, self.annotated_at, self.owed, self.kinds))

    async def write(self, group: GroupView, pg: dict[str, Any] | None, status: PlacementGroupStatus) -> bool:
        """Create the PlacementGroup when missing and write its status when it changed. True when written."""
        ns, name = pg_key(group.spec)
        body_status = status.model_dump(by_alias=True, mode="json")
        if pg is not None and (pg.get("status") or {}) == body_status:
            return False
        if pg is None:
            pg = await self._create(group)
            if not owns(pg, group.spec.key):
                # Created by another group whose key gives the same name: never written over, and the
                # caller must not go on as if this status were written (an admission releases its pods
                # after it). The next pass finds it taken and says so.
                other = (pg.get("spec") or {}).get("key")
                raise ApiException(status=409, reason=f"PlacementGroup {ns}/{name} belongs to group {other}")
            if (pg.get("status") or {}) == body_status:
                return False
        patch = [{"op": "add", "path": "/status", "value": body_status}]
        try:
            written = await asyncio.to_thread(
                self.custom.patch_namespaced_custom_object_status,
                model.GROUP,
                model.VERSION,
                ns,
                model.PLURAL,
                name,
                patch,
                _content_type="application/json-patch+json",
                _request_timeout=self.timeout,
            )
        except ApiException as exc:
            if exc.status == 404 and names_object(exc, name):
                # Gone, though the tables hold it: a write's answer applied after the watch's DELETED put
                # it back, and no event would take it out again (every pass patched it, 404, for good).
                # Taken as deleted: the next pass writes it again from what was last written.
                self.tables.apply_pg("DELETED", pg)
            raise
        self.tables.apply_pg("MODIFIED", written)
        return True

    async def _create(self, group: GroupView) -> dict[str, Any]:
        """The PlacementGroup, without status: created, or as it exists when someone created it first."""
        spec = group.spec
        ns, name = pg_key(spec)
        meta: dict[str, Any] = {
            "name": name,
            "namespace": ns,
            "labels": {**model.MANAGED_BY, model.FAMILY_LABEL: spec.family},
        }
        owner = group.owner
        lost = self.tables.lost.get((ns, name))
        refs = (lost.get("metadata") or {}).get("ownerReferences") if lost is not None else None
        if owner is None and isinstance(refs, list) and refs:
            meta["ownerReferences"] = refs  # written again as it was: still goes with its owner
        elif owner is not None and owner.uid:
            # Garbage-collected with the Job (JobSet, ...) it describes.
            meta["ownerReferences"] = [
                {
                    "apiVersion": owner.api_version,
                    "kind": owner.ref.kind,
                    "name": owner.ref.name,
                    "uid": owner.uid,
                }
            ]
        obj = model.PlacementGroup(
            metadata=meta,
            spec=model.PlacementGroupSpec(key=spec.key, family=spec.family, name=spec.name),
        ).model_dump(by_alias=True, mode="json", exclude={"status"})
        create, get = self.custom.create_namespaced_custom_object, self.custom.get_namespaced_custom_object
        try:
            pg = await asyncio.to_thread(
                create, model.GROUP, model.VERSION, ns, model.PLURAL, obj, _request_timeout=self.timeout
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
            pg = await asyncio.to_thread(
                get, model.GROUP, model.VERSION, ns, model.PLURAL, name, _request_timeout=self.timeout
            )
        assert pg is not None
        self.tables.apply_pg("ADDED", pg)
        return dict(pg)

    def events(
        self,
        group: GroupView,
        pods: list[dict[str, Any]],
        type_: str,
        reason: str,
        message: str,
        *,
        pg_too: bool = False,
    ) -> None:
        targets: list[Mapping[str, Any]] = list(pods)
        if pg_too:
            pg = self.tables.pgs.get(pg_key(group.spec))
            if pg is not None:
                targets.append(pg)
        for obj in targets:  # the publisher's spam filter holds back a burst about one object
            self.publisher.event(obj, type_, reason, message)
        for pod in pods:
            self.kinds[podview.uid(pod)] = reason

    def tell(self, group: GroupView, pods: list[dict[str, Any]], type_: str, reason: str, text: str) -> None:
        """A waiting group's decision: an Event on each pod only when its kind (reason) is new to the pod,
        one on the PlacementGroup each time; the text copied onto the pods at once when its kind is new,
        else at most every DECISION_EVERY_S (`flush`)."""
        new = [p for p in pods if self.kinds.get(podview.uid(p)) != reason]
        self.events(group, new, type_, reason, text, pg_too=True)
        self.annotate(new, text)
        now, told = self.clock(), {podview.uid(p) for p in new}
        for pod in pods:
            if (uid := podview.uid(pod)) not in told:
                self._owe(pod, uid, text, now)

    def _owe(self, pod: dict[str, Any], uid: str, text: str, now: float) -> None:
        if self.annotated.get(uid) == text:
            self.owed.pop(uid, None)
        elif now - self.annotated_at.get(uid, float("-inf")) >= DECISION_EVERY_S:
            self.annotate([pod], text)
        else:
            self.owed[uid] = text

    def flush(self) -> None:
        """The texts held back whose time has come, onto pods still gated (each pass)."""
        now = self.clock()
        for uid, text in list(self.owed.items()):
            pod = self.tables.pods.get(uid)
            if pod is None or not self.tables.gated(pod):
                del self.owed[uid]
            elif now - self.annotated_at.get(uid, float("-inf")) >= DECISION_EVERY_S:
                self.annotate([pod], text)

    def annotate(self, pods: list[dict[str, Any]], text: str) -> None:
        """The decision copied onto each pod for `kubectl describe pod`; never read back."""
        for pod in pods:
            uid = podview.uid(pod)
            self.owed.pop(uid, None)
            if self.annotated.get(uid) == text:
                continue
            self.annotated[uid] = text
            self.annotated_at[uid] = self.clock()
            self.publisher.annotate(pod, {self.decision_key: text[:MAX_DECISION]})

    def tell_ungrouped(self, ungrouped: list[tuple[dict[str, Any], str]]) -> None:
        """A pod carrying our gate (its template's) in no group that can be admitted waits for ever: each
        is told why, once (pod, why its group cannot be read or "" when it names none). It stays gated:
        its labels and annotations may still name a group."""
        for pod, error in ungrouped:
            why = f"its group cannot be read ({error})" if error else "it names no group nodefabric knows"
            text = (
                f"the pod carries the scheduling gate {self.tables.gate}, but {why}: only groups are "
                "admitted, and the gate stays until the pod names one"
            )
            if self.annotated.get(podview.uid(pod)) != text:
                self.publisher.event(pod, "Warning", "InvalidPlacement", text)
                self.annotate([pod], text)

    def tell_relabelled(self, relabelled: list[tuple[dict[str, Any], str, str]]) -> None:
        """A pod relabelled after its group was admitted stays a member of the group that admitted it
        (its node was given for that group); the group its labels name now does not count it. Each is
        told once (pod, the key its labels name or "", the key of the group that holds it)."""
        for pod, named, held_by in relabelled:
            now = f"its labels now name group {named:.300}" if named else "its labels now name no group"
            text = (
                f"{now}, but group {held_by:.300} was admitted with this pod: it stays a member of "
                f"{held_by:.300} while it exists"
                + (f", and group {named:.300} does not count it" if named else "")
            )
            if self.annotated.get(podview.uid(pod)) != text:
                self.publisher.event(pod, "Warning", "MemberRelabelled", text)
                self.annotate([pod], text)

    def name_taken(self, group: GroupView, pg: Mapping[str, Any]) -> None:
        """The group's PlacementGroup name is another group's (a name changed to fit, "explicit-x-<hash>",
        and a group named "x-<hash>" beside it): that one's state is never read nor written for this
        group, which waits, gated; each gated pod is told once."""
        ns, name = pg_key(group.spec)
        other = (pg.get("spec") or {}).get("key")
        text = (
            f"group {group.spec.key} is not admitted: its PlacementGroup {ns}/{name} belongs to group "
            f"{other!s:.300}; give the group another name"
        )
        untold = [
            p for p in group.members if self.tables.gated(p) and self.annotated.get(podview.uid(p)) != text
        ]
        if untold:
            log.warning(
                "a group's PlacementGroup name is taken", extra={"group": group.spec.key, "by": other}
            )
            self.events(group, untold, "Warning", "InvalidPlacement", text)
            self.annotate(untold, text)
