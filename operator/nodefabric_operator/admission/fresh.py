"""When a waiting group must be decided again: only when one of its inputs changed since its last decision.

A group's inputs are its pods (how many times what is kept of each changed: a member added, gone,
relabelled, ungated, bound or made Ready; not the decision copied onto it), its own phase and attempt
count, the capacity it could use (Tables.freed: any change that may give room; one that only takes room
cannot make a waiting group fit) and its owner's count, read again after SIZE_TTL_S. With none of them
changed the decision would be the one already written: deciding it again on every watch event made each
pass cost as much as every waiting group's decision together.

`every_event` keeps the former rule (any watch event decides every waiting group again): the benchmark
and the tests that show both rules reach the same decisions run it beside the new one.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from nodefabric_operator.admission import podview
from nodefabric_operator.admission.grouping import GroupView
from nodefabric_operator.admission.model import PlacementGroupStatus
from nodefabric_operator.admission.owners import Owner, Size
from nodefabric_operator.admission.state import Tables


@dataclass(frozen=True)
class Seen:
    """A group's inputs at its last decision, when it was made, and the size its owner gave then."""

    inputs: Hashable
    when: float
    sized: tuple[Size, str] | None = None


def inputs(tables: Tables, group: GroupView, status: PlacementGroupStatus, *, every_event: bool) -> Hashable:
    if every_event:
        return tables.generation
    changes = tables.changes
    pods = tuple(sorted((uid, changes.get(uid, 0)) for uid in map(podview.uid, group.candidates)))
    return tables.freed, status.phase, status.attempts, pods


def sized(size: Size, owner: Owner | None) -> tuple[Size, str]:
    """The owner's answer as it bears on the decision: the count and whose pods count (its uid)."""
    return size, owner.uid if owner is not None else ""
