"""The admission rule: may this group go now, and to which node does each member go? Pure.

Given the group's members (gated pods of its namespace using the same scheduler, not terminal, as the
caller found them), its expected size, and a snapshot of the nodes whose load already counts the groups
admitted but not yet bound, the answer is one of: wait (with the reason), never fits, or admitted with a
node for every gated member. The placement itself is `extender.placement.decide` with every gated member
still to place, so the explanation is the extender's text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Literal

from nodefabric_operator.admission.owners import Size
from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.extender.groups import GroupSpec
from nodefabric_operator.extender.index import NodeView, Shape
from nodefabric_operator.extender.nodes import NodeRecord
from nodefabric_operator.extender.placement import Decision, GroupRequest, Snapshot, decide
from nodefabric_operator.extender.pods import BLOCKING_EFFECTS, TRANSIENT_TAINT_PREFIXES, PodNeeds

Outcome = Literal["wait", "never-fits", "admitted"]


@dataclass(frozen=True)
class Member:
    """One pod of the group, as the admission reads it."""

    name: str
    uid: str
    needs: PodNeeds
    gated: bool  # carries our gate
    node: str = ""  # bound to, "" while not
    created: float = 0.0  # creation time: the oldest gated pods are the group when there are too many


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    reason: str  # the decision's summary, or why the group waits before any decision
    decision: Decision | None = None
    assignments: Mapping[str, str] = field(default_factory=dict)  # gated member name -> node


def group_needs(members: Sequence[Member]) -> PodNeeds:
    """What one pod of the group asks: each resource's largest request among the gated members (a
    leader asking less than its workers is held to the workers' room), the first member's node rules."""
    gated = sorted((m for m in members if m.gated and not m.node), key=lambda m: m.name)
    if not gated:
        return PodNeeds()
    first = gated[0].needs
    extended: dict[str, int] = {}
    for m in gated:
        for k, v in m.needs.extended.items():
            extended[k] = max(extended.get(k, 0), v)
    return PodNeeds(
        extended=extended,
        cpu=max(m.needs.cpu for m in gated),
        memory=max(m.needs.memory for m in gated),
        selector=first.selector,
        terms=first.terms,
        tolerations=first.tolerations,
    )


def _blocked_now(record: NodeRecord, needs: PodNeeds) -> bool:
    """A taint of the moment (not-ready, unreachable, unschedulable: the ones "never fits" forgives)
    that the pod does not tolerate: kube-scheduler would not bind it there now."""
    for taint in record.taints:
        if taint.effect not in BLOCKING_EFFECTS or not taint.key.startswith(TRANSIENT_TAINT_PREFIXES):
            continue
        if not any(t.tolerates(taint) for t in needs.tolerations):
            return True
    return False


def feasible(
    snap: Snapshot, needs: PodNeeds, shape: Shape, unschedulable: AbstractSet[str] = frozenset()
) -> set[str]:
    """The nodes one pod of the group could go to now: its node rules hold, the node is neither cordoned
    nor tainted for the moment against it, and it has room."""
    out = set()
    for name, view in snap.views.items():
        if name in unschedulable:
            continue
        if view.record is not None and (not needs.admits(view.record) or _blocked_now(view.record, needs)):
            continue
        if snap.index.slots(view, shape) <= 0:
            continue
        out.add(name)
    return out


def admit(
    spec: GroupSpec,
    size: Size,
    members: Sequence[Member],
    snap: Snapshot,
    config: ExtenderConfig,
    *,
    unschedulable: AbstractSet[str] = frozenset(),
) -> Verdict:
    """`unschedulable`: the cordoned nodes (spec.unschedulable), which the snapshot does not carry."""
    if size.value is None:
        return Verdict("wait", size.reason or "group size unknown")
    total = size.value
    # Pods neither gated nor bound are kube-scheduler's already (their gate went some other way): not
    # ours to place, so they never count, and cannot hold a group back.
    bound = sorted(m.node for m in members if m.node)
    gated = sorted((m for m in members if m.gated and not m.node), key=lambda m: (m.created, m.name))
    have = len(bound) + len(gated)
    if have < total:
        return Verdict(
            "wait", f"group {spec.key} waits for its members: {have} of {total} exist ({size.source})"
        )
    if len(bound) >= total:
        return Verdict(
            "wait",
            f"group {spec.key} has its {total} pods bound ({size.source}); "
            f"{len(gated)} more gated pod(s) wait until some of them are gone",
        )
    # More gated pods than places: the oldest are the group, the rest wait (a pod made later, by anyone
    # who can create pods with the group's labels, never displaces one already waiting).
    gated = sorted(gated[: total - len(bound)], key=lambda m: m.name)
    needs = group_needs(gated)
    keys = spec.homogeneous_keys
    if keys is None:
        keys = config.homogeneity_for(needs.extended)
    request = GroupRequest(
        key=spec.key,
        size=total,
        remaining=len(gated),
        locality=spec.locality,
        rank=spec.rank,
        homogeneous_keys=keys,
        default_keys=spec.homogeneous_keys is None,
        needs=needs,
        members=tuple(bound),
    )
    decision = decide(request, feasible(snap, needs, request.shape, unschedulable), snap, config)
    if decision.outcome == "never-fits":
        return Verdict("never-fits", decision.summary, decision)
    if decision.outcome != "placed":
        return Verdict("wait", decision.summary, decision)
    assignments = assign(gated, decision, snap, request.shape, spec.rank)
    if assignments is None:
        return Verdict(
            "wait",
            f"group {spec.key} waits: its location has room for fewer than "
            f"{len(gated)} pods now, counting only nodes each pod's own node rules admit "
            f"({decision.summary})",
            decision,
        )
    return Verdict("admitted", decision.summary, decision, assignments)


def assign(
    gated: Sequence[Member], decision: Decision, snap: Snapshot, shape: Shape, rank: str = "spread"
) -> dict[str, str] | None:
    """Members onto the planned nodes in rank order, each node filled to its slots; None when the nodes
    hold fewer. A placement that only narrowed the nodes (members already bound) fills the allowed nodes
    in the rank's order. The placement was decided with one member's node rules: each member goes only
    to a node its own rules admit (a pin to a node the pod refuses would never bind), the members with
    the fewest such nodes first, then by name."""
    nodes = list(decision.planned)
    if not nodes:
        allowed = set(decision.allowed)
        nodes = [v.name for v in snap.ranked(rank) if v.name in allowed]
    views = [v for v in (snap.views.get(n) for n in nodes) if v is not None]

    def fits(m: Member, view: NodeView) -> bool:
        record = view.record
        return record is None or (m.needs.admits(record) and not _blocked_now(record, m.needs))

    options = {m.name: sum(1 for v in views if fits(m, v)) for m in gated}
    pending = sorted(gated, key=lambda m: (options[m.name], m.name))
    out: dict[str, str] = {}
    for view in views:
        room = snap.index.slots(view, shape)
        for m in list(pending):
            if room <= 0:
                break
            if fits(m, view):
                out[m.name] = view.name
                pending.remove(m)
                room -= 1
        if not pending:
            return out
    return None
