"""How a PlacementGroup's status moves: waiting (or never fits), admitted, bound, timed out. Pure
functions: each takes the status as read and returns the next one; the controller writes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from nodefabric_operator.admission import model, podview
from nodefabric_operator.admission.admit import Verdict
from nodefabric_operator.admission.grouping import GroupView
from nodefabric_operator.admission.model import Phase, PlacementGroupStatus
from nodefabric_operator.admission.owners import Size

MAX_MESSAGE = 1024  # a condition's message; the decision itself is kept whole


def now_dt(now: float) -> datetime:
    # Milliseconds kept: a timeout of a few seconds must not lose up to one of them to rounding.
    return datetime.fromtimestamp(round(now, 3), UTC)


def ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _by_name(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(pods, key=podview.name)


def _member(pod: dict[str, Any], status: PlacementGroupStatus) -> model.Member:
    """A member as a decision records it. One still bound where an earlier admission of the group put it
    keeps that node: it is the only record that the group's own admission gave it (grouping.vouch), and
    without it a group deciding again (a member replaced, waiting for room) would stop counting it."""
    uid, bound_to = podview.uid(pod), pod["spec"].get("nodeName")
    given = any(m.uid == uid and m.node and m.node == bound_to for m in status.members)
    if given:
        return model.Member(pod=podview.name(pod), uid=uid, node=str(bound_to), bound=True)
    return model.Member(pod=podview.name(pod), uid=uid)


def decided(
    status: PlacementGroupStatus,
    group: GroupView,
    phase: Phase,
    text: str,
    at: datetime,
    *,
    size: Size | None = None,
    verdict: Verdict | None = None,
) -> PlacementGroupStatus:
    """The group as decided this pass, its Admitted condition False (or about to be set True)."""
    new = status.model_copy(deep=True)
    new.phase = phase
    new.decision = text
    if size is not None:
        new.size, new.size_source = size.value, size.source
    spec = group.spec
    new.locality, new.rank = spec.locality, spec.rank
    if spec.homogeneous_keys is not None:
        new.homogeneous_keys = list(spec.homogeneous_keys)
    new.members = [_member(p, status) for p in _by_name(group.members)]
    new.level = verdict.decision.level if verdict and verdict.decision else ""
    new.location, new.homogeneity = "", {}
    reason = {"Pending": "SizeUnknown", "Waiting": "Waiting", "NeverFits": "NeverFits"}.get(phase, phase)
    new.conditions = model.set_condition(
        new.conditions, "Admitted", status="False", reason=reason, message=text[:MAX_MESSAGE], now=at
    )
    return new


def admitted(
    status: PlacementGroupStatus, group: GroupView, size: Size, verdict: Verdict, now: float
) -> PlacementGroupStatus:
    """The group given its nodes: each member's assignment, the location chosen, one more attempt."""
    decision = verdict.decision
    assert decision is not None
    choice = decision.choice
    at = now_dt(now)
    new = decided(status, group, "Admitted", verdict.reason, at, size=size, verdict=verdict)
    new.members = [
        model.Member(
            pod=podview.name(p),
            uid=podview.uid(p),
            node=verdict.assignments.get(podview.name(p), str(p["spec"].get("nodeName") or "")),
            bound=bool(p["spec"].get("nodeName")),
            ready=podview.ready(p),
        )
        for p in _by_name(group.members)
        # The group is its bound pods and those given a node; extra gated pods stay out, gated.
        if p["spec"].get("nodeName") or podview.name(p) in verdict.assignments
    ]
    if choice is not None:
        new.level = choice.level
        new.location = choice.location or ""
        new.homogeneity = dict(choice.homogeneity)
    new.admitted_time = at
    new.next_attempt_time = None
    new.attempts = status.attempts + 1
    new.conditions = model.set_condition(
        new.conditions,
        "Admitted",
        status="True",
        reason="Admitted",
        message=verdict.reason[:MAX_MESSAGE],
        now=at,
    )
    new.conditions = model.set_condition(
        new.conditions, "AllBound", status="False", reason="Binding", message="waiting for binding", now=at
    )
    if new.condition("TimedOut") is not None:
        new.conditions = model.set_condition(
            new.conditions, "TimedOut", status="False", reason="Readmitted", message="", now=at
        )
    return new


def with_flags(status: PlacementGroupStatus, pods: Mapping[str, Mapping[str, Any]]) -> PlacementGroupStatus:
    """Each member's bound and ready as its pod (uid -> pod) now says. Bound means bound on its assigned
    node: a member bound elsewhere (its gate removed by hand before its pin) leaves the group split, not
    whole where it was placed, so it never counts and the group times out."""
    new = status.model_copy(deep=True)
    for m in new.members:
        pod = pods.get(m.uid)
        node = pod["spec"].get("nodeName") if pod else None
        m.bound = bool(node) and (not m.node or node == m.node)
        # A member that ran to completion (a short task done before its siblings were Ready) is no
        # longer Ready but was whole where placed: timing the group out would evict the running rest.
        m.ready = bool(pod and (podview.ready(pod) or (pod.get("status") or {}).get("phase") == "Succeeded"))
    return new


def gone_unready(status: PlacementGroupStatus, pods: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The members whose pod is gone (deleted) or failed without ever having been recorded ready: the
    group can no longer be whole. One recorded ready may have run to completion before its pod went."""

    def lost(uid: str) -> bool:
        pod = pods.get(uid)
        return pod is None or (pod.get("status") or {}).get("phase") == "Failed"

    return [m.pod for m in status.members if not m.ready and lost(m.uid)]


def everyone_ready(status: PlacementGroupStatus) -> bool:
    return bool(status.members) and all(m.bound and m.ready for m in status.members)


def bound(status: PlacementGroupStatus, now: float) -> PlacementGroupStatus:
    new = status.model_copy(deep=True)
    new.phase = "Bound"
    new.conditions = model.set_condition(
        new.conditions, "AllBound", status="True", reason="AllBoundAndReady", message="", now=now_dt(now)
    )
    return new


def timed_out(
    status: PlacementGroupStatus,
    key: str,
    timeout: float,
    backoff: float,
    now: float,
    *,
    present: set[str],
    gone: list[str] | None = None,
) -> PlacementGroupStatus:
    """The reason recorded before anything is evicted, the next attempt `backoff` seconds away, and as
    members the pods still to evict (those in `present`, uids). `gone`: members deleted before they were
    ready, for which the group is timed out early."""
    missing = [m.pod for m in status.members if not (m.bound and m.ready)]
    reason = (
        f"group {key} was not bound and Ready within {timeout:g}s of its admission "
        f"({len(missing)} of {len(status.members)} not: {', '.join(missing[:8])}); its pods are evicted "
        "and the group is admitted afresh"
    )
    if gone:
        reason = (
            f"group {key} lost {len(gone)} member(s) before they were Ready ({', '.join(gone[:8])}) and "
            "can no longer be whole; its pods are evicted and the group is admitted afresh"
        )
    at = now_dt(now)
    new = status.model_copy(deep=True)
    new.phase = "TimedOut"
    new.decision = reason
    new.next_attempt_time = now_dt(now + backoff) if backoff >= 1 else at + timedelta(seconds=backoff)
    message = reason[:MAX_MESSAGE]
    new.conditions = model.set_condition(
        new.conditions, "TimedOut", status="True", reason="GroupTimedOut", message=message, now=at
    )
    new.conditions = model.set_condition(
        new.conditions, "Admitted", status="False", reason="GroupTimedOut", message=message, now=at
    )
    new.conditions = model.set_condition(
        new.conditions, "AllBound", status="False", reason="GroupTimedOut", message="", now=at
    )
    # The members still listed while timed out are the pods still to evict; those a PodDisruptionBudget
    # keeps are tried again on later passes.
    new.members = [m for m in status.members if m.uid in present]
    return new
