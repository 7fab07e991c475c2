"""The nesting check: a pure function of the configured levels and the live fleet's node labels.

Each level is read under one label key, the first of its keys any node carries: a projection names one
label per level, so that is the label schedulers will read. Every value of a tighter level must lie inside
one value of each looser level; a node without a level's label belongs to no domain of it and is fine. A
level with a value that spans two values of any looser level is violating, and is left out of every
projection until it nests again. The tighter level is the one blamed: a fabric domain across two leaves is
a fabric domain nobody can rely on, while the leaves themselves may well be right.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from nodefabric_operator.extender.config import Level

SHOWN_VALUES = 3  # looser values a violation names
SHOWN_NODES = 3  # nodes a violation names

PROJECTED, ABSENT, VIOLATING = "projected", "absent", "violating"


@dataclass(frozen=True)
class Violation:
    """One value of `level` whose nodes sit under several values of the looser level `against`."""

    level: str
    title: str
    key: str
    value: str
    against: str
    against_title: str
    against_key: str
    against_values: tuple[str, ...]  # every distinct looser value, sorted
    nodes: tuple[str, ...]  # a few nodes, one per looser value first

    def message(self) -> str:
        shown = ", ".join(self.against_values[:SHOWN_VALUES])
        more = len(self.against_values) - SHOWN_VALUES
        if more > 0:
            shown += f" and {more} more"
        return (
            f"{self.title} {self.value} ({self.key}) spans {len(self.against_values)} "
            f"{self.against_title} values ({self.against_key}: {shown}); nodes {', '.join(self.nodes)}"
        )


@dataclass(frozen=True)
class CheckedLevel:
    level: Level
    key: str | None  # the label the fleet carries this level under; None: no node carries any of its keys
    nodes: int = 0  # nodes carrying `key`
    values: int = 0  # distinct values of `key`
    elsewhere: tuple[str, ...] = ()  # nodes carrying the level only under another of its keys (a few)
    elsewhere_count: int = 0
    violations: tuple[Violation, ...] = ()

    @property
    def name(self) -> str:
        return self.level.name

    @property
    def title(self) -> str:
        return self.level.label

    @property
    def state(self) -> str:
        if self.key is None:
            return ABSENT
        return VIOLATING if self.violations else PROJECTED

    @property
    def projected(self) -> bool:
        return self.state == PROJECTED

    def reason(self) -> str:
        """Why the level is or is not in the projections, for the report and the log."""
        if self.key is None:
            return f"no node carries any of {', '.join(self.level.keys)}"
        if self.violations:
            first = self.violations[0]
            more = len(self.violations) - 1
            tail = f" (and {more} more violations)" if more else ""
            return f"left out of every projection: {first.message()}{tail}"
        text = f"{self.values} values on {self.nodes} nodes under {self.key}"
        if self.elsewhere_count:
            text += (
                f"; {self.elsewhere_count} nodes carry it only under another key and are outside it "
                f"(e.g. {', '.join(self.elsewhere)})"
            )
        return text


@dataclass(frozen=True)
class Hierarchy:
    """The checked hierarchy: every configured level, tightest first, with its state."""

    levels: tuple[CheckedLevel, ...]
    nodes: int
    violations: tuple[Violation, ...] = field(default=())

    @property
    def projected(self) -> tuple[CheckedLevel, ...]:
        """The levels every projection carries, tightest first."""
        return tuple(lv for lv in self.levels if lv.projected)

    def violations_by_level(self) -> dict[str, int]:
        """Violating values per configured level (0 for a clean one): the metric's figures."""
        return {lv.name: len(lv.violations) for lv in self.levels}


def _chosen_key(level: Level, fleet: Mapping[str, Mapping[str, str]]) -> str | None:
    carried = {k for node_labels in fleet.values() for k in level.keys if k in node_labels}
    return next((k for k in level.keys if k in carried), None)


def check(levels: Sequence[Level], fleet: Mapping[str, Mapping[str, str]]) -> Hierarchy:
    """Check that `levels` (tightest first) nest over `fleet` (node name -> labels)."""
    keys = [_chosen_key(lv, fleet) for lv in levels]
    columns: list[dict[str, str]] = []
    for key in keys:
        columns.append({n: lab[key] for n, lab in fleet.items() if key is not None and key in lab})

    found: list[list[Violation]] = [[] for _ in levels]
    for i, tight in enumerate(levels):
        key = keys[i]
        if key is None:
            continue
        for j in range(i + 1, len(levels)):
            loose_key = keys[j]
            if loose_key is None:
                continue
            found[i] += _spans(tight, key, columns[i], levels[j], loose_key=loose_key, loose_col=columns[j])

    checked = []
    for i, lv in enumerate(levels):
        key = keys[i]
        elsewhere = sorted(
            n
            for n, lab in fleet.items()
            if key is not None and key not in lab and any(k in lab for k in lv.keys)
        )
        checked.append(
            CheckedLevel(
                level=lv,
                key=key,
                nodes=len(columns[i]),
                values=len(set(columns[i].values())),
                elsewhere=tuple(elsewhere[:SHOWN_NODES]),
                elsewhere_count=len(elsewhere),
                violations=tuple(found[i]),
            )
        )
    every = tuple(v for vs in found for v in vs)
    return Hierarchy(levels=tuple(checked), nodes=len(fleet), violations=every)


def _spans(
    tight: Level,
    key: str,
    tight_col: Mapping[str, str],
    loose: Level,
    *,
    loose_key: str,
    loose_col: Mapping[str, str],
) -> Iterable[Violation]:
    """The values of `tight` whose nodes carry more than one value of `loose`."""
    under: dict[str, dict[str, list[str]]] = {}
    for node, value in tight_col.items():
        outer = loose_col.get(node)
        if outer is not None:
            under.setdefault(value, {}).setdefault(outer, []).append(node)
    for value in sorted(under):
        outers = under[value]
        if len(outers) < 2:
            continue
        shown = sorted(outers)
        # One node from each of the first looser values, so the Event shows the split itself.
        nodes = [min(outers[o]) for o in shown[:SHOWN_NODES]]
        yield Violation(
            level=tight.name,
            title=tight.label,
            key=key,
            value=value,
            against=loose.name,
            against_title=loose.label,
            against_key=loose_key,
            against_values=tuple(shown),
            nodes=tuple(nodes),
        )
