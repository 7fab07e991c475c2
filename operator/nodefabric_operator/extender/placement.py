"""The placement decision: a pure, deterministic function over a snapshot of the cluster.

Given the nodes kube-scheduler found feasible for one pod, the snapshot of every node (views and their
index), the pod's group (size, policy, the bucket chosen by an earlier pod, the members already bound)
and the configuration, `decide` returns the nodes the pod may use, a stable reason for every node
turned away, and a summary a person can read. Nothing here does I/O or reads a clock.

Vocabulary (ADR-0021, ADR-0004):
- level: fabric domain, network group, zone, region (configurable), tightest first; "any" last.
- bucket: the nodes sharing one (homogeneity values, location at a level). Nodes are taken in rank
  order and the first bucket to hold every remaining pod of the group wins, so load balancing decides
  between equally close buckets.
- whole or nothing, under every policy: the first pod of a group passes only when some bucket (under
  `prefer` the tightest level that has one, finally any location) holds every remaining pod now.
  Otherwise the group waits, or "never fits" when no bucket of the whole cluster could ever hold it,
  counting every node the pods may use as empty.
- an unknown value never satisfies a requirement: a node without a value at a level, or without a
  homogeneity label, is in no bucket of that level or key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from functools import cached_property
from operator import attrgetter
from typing import Literal

from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.extender.index import (
    Bucket,
    HomogIndex,
    Index,
    Keys,
    NodeView,
    Shape,
    homog_values,
)
from nodefabric_operator.extender.pods import PodNeeds

ANY = "any"
Outcome = Literal["placed", "wait", "never-fits", "pass-through"]
# How many of the nodes a group is planned on the summary names before "and N more".
NAMED_NODES = 16
_NONE: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Choice:
    """The bucket a group was given; later pods of the group are held to it."""

    level: str  # a level name or "any"
    location: str | None  # None for "any"
    homogeneity: tuple[tuple[str, str], ...]  # (label key, value) the group's nodes share
    # Enclosing (level, location) pairs, tightest first, that every node of the bucket shares: where a
    # `prefer` group may widen to when its bucket has no feasible node left.
    enclosing: tuple[tuple[str, str], ...] = ()
    summary: str = ""


@dataclass(frozen=True)
class GroupRequest:
    key: str
    size: int
    remaining: int  # pods of the group still to place, this one included
    locality: str  # "prefer", "any" or a level name (required)
    rank: str
    homogeneous_keys: Keys
    needs: PodNeeds = field(default_factory=PodNeeds)  # one pod's requests and node rules
    choice: Choice | None = None
    members: tuple[str, ...] = ()  # nodes the group's bound pods run on
    # The homogeneity keys are the configuration's defaults, not the group's own `homogeneous`
    # annotation: a default key no node carries is skipped (and said), a group's own is a requirement.
    default_keys: bool = False

    @property
    def request(self) -> Mapping[str, int]:
        """The extended resources one pod asks for."""
        return self.needs.extended

    @cached_property
    def shape(self) -> Shape:
        return Shape(self.needs.extended, self.needs.cpu, self.needs.memory)


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    allowed: tuple[str, ...]
    # reason -> the nodes turned away for it. Grouped because reasons are few and stable
    # (kube-scheduler counts identical strings) and the answer encodes them fastest that way.
    rejected: Mapping[str, Sequence[str]]
    unresolvable: bool  # rejected nodes go to FailedAndUnresolvableNodes: preemption cannot help
    level: str  # the level placed at, or the level waited on; "none" for pass-through
    summary: str
    choice: Choice | None = None  # the group's bucket after this decision (new, kept or widened)
    planned: tuple[str, ...] = ()  # a new bucket: the nodes, in rank order, that hold the group now

    @property
    def failed(self) -> dict[str, str]:
        """node -> reason, for every node turned away."""
        return {node: reason for reason, nodes in self.rejected.items() for node in nodes}


class Snapshot:
    """Every node the decision may read: views by name, their index, and the standing rank orders.

    The cache keeps one current from the watches; a request carrying its own Nodes gets a throwaway one.
    """

    def __init__(self, index: Index, cluster: Mapping[str, NodeView] | None = None) -> None:
        self.index = index
        self.views: Mapping[str, NodeView] = index.views
        # Every node the "could it ever fit" question counts; the indexed views unless told otherwise.
        self.cluster: Mapping[str, NodeView] = cluster if cluster is not None else index.views
        self._ranked: dict[str, list[NodeView]] = {}

    def carries(self, key: str) -> bool:
        """Whether any node of the cluster has the label `key` (with a value)."""
        if self.cluster is self.index.views:
            return self.index.carries(key)
        return self.index.carries(key) or any(v.labels.get(key) for v in self.cluster.values())

    def ranked(self, rank: str) -> Sequence[NodeView]:
        """Every node in the rank policy's order (the cache overrides this with a standing order)."""
        order = self._ranked.get(rank)
        if order is None:
            order = self._ranked[rank] = sorted(self.views.values(), key=RANK_KEYS.get(rank, _SPREAD))
        return order


# --- ranking ------------------------------------------------------------------------------------

_SPREAD = attrgetter("spread_key")
RANK_KEYS = {"spread": _SPREAD, "first-fit": attrgetter("name"), "most-free-memory": attrgetter("memory_key")}


def rank_order(nodes: Iterable[NodeView], rank: str) -> list[NodeView]:
    return sorted(nodes, key=RANK_KEYS.get(rank, _SPREAD))


def scores(ordered: Sequence[str]) -> dict[str, int]:
    """0..10 by rank position: the best node 10, the last 0 (one node: 10)."""
    n = len(ordered)
    if n <= 1:
        return dict.fromkeys(ordered, 10)
    return {name: round(10 * (n - 1 - i) / (n - 1)) for i, name in enumerate(ordered)}


def priorities(decision: Decision, views: Mapping[str, NodeView], rank: str) -> dict[str, int]:
    """Prioritize: allowed nodes scored by the rank policy, everything else 0; pass-through all 0."""
    if decision.outcome == "pass-through":
        return {}
    allowed = [views[n] for n in decision.allowed if n in views]
    return scores([v.name for v in rank_order(allowed, rank)])


# --- wording ------------------------------------------------------------------------------------


def _describe_homog(pairs: tuple[tuple[str, str], ...]) -> str:
    shown = [f"{k}={v}" for k, v in pairs if v]
    return f" with {', '.join(shown)}" if shown else ""


def _of_one(keys: Keys) -> str:
    return f" of one {', '.join(keys)}" if keys else ""


def name_nodes(names: Sequence[str]) -> str:
    shown = ", ".join(names[:NAMED_NODES])
    more = len(names) - NAMED_NODES
    return f"{shown} and {more} more" if more > 0 else shown


class _Ctx:
    """What one decision reads over and over, computed once."""

    def __init__(
        self, config: ExtenderConfig, group: GroupRequest, snap: Snapshot, complete: bool = True
    ) -> None:
        self.config = config
        self.group = group
        self.snap = snap
        self.complete = complete  # every node kube-scheduler passed is in the snapshot
        self.index = snap.index
        self.names = config.level_names
        self.titles = tuple(lv.label for lv in config.levels)

    def li(self, level: str) -> int:
        """The level's position; "any" is one past the configured levels."""
        return len(self.names) if level == ANY else self.names.index(level)

    def title(self, level: str) -> str:
        return "location" if level == ANY else self.titles[self.names.index(level)]

    def where(self, level: str, location: str | None, enclosing: Sequence[tuple[str, str]]) -> str:
        if level == ANY or location is None:
            return "any location"
        text = f"{self.title(level)} {location}"
        for lv, loc in enclosing:
            text += f" of {self.title(lv)} {loc}"
        return text

    def bucket_name(self, level: str) -> str:
        """What one bucket of the level is called in a reason: "zone of one nvidia.com/gpu.product"."""
        keys = self.group.homogeneous_keys
        if level == ANY:
            return f"set of nodes{_of_one(keys)}"
        return f"{self.title(level)}{_of_one(keys)}"


def _levels_for(locality: str, config: ExtenderConfig) -> tuple[str, ...]:
    if locality == "prefer":
        return (*config.level_names, ANY)
    return (locality,)


# --- splitting the feasible nodes by a bucket -------------------------------------------------------


class _Lazy(Mapping[str, list[str]]):
    """reason -> nodes, worked out on first read: a caller that only wants the allowed nodes (lean
    answers) never pays for splitting thousands of turned-away nodes by reason."""

    def __init__(self, make: Callable[[], dict[str, list[str]]]) -> None:
        self._make: Callable[[], dict[str, list[str]]] | None = make
        self._done: dict[str, list[str]] = {}

    def _get(self) -> dict[str, list[str]]:
        if self._make is not None:
            self._done, self._make = self._make(), None
        return self._done

    def __getitem__(self, key: str) -> list[str]:
        return self._get()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


@dataclass
class _Answer:
    allowed: list[str]
    rejected: Mapping[str, list[str]]
    enclosing: tuple[tuple[str, str], ...] = ()


def _answer(ctx: _Ctx, choice: Choice, feasible: AbstractSet[str], *, enclose: bool = False) -> _Answer:
    """Split the feasible nodes into the bucket and the rest (set operations over the index), with a
    reason for each of the rest worked out lazily. With `enclose`, also find the looser (level,
    location) pairs every allowed node shares.

    The sets are cut smallest first, and not at all by `feasible` when it holds every indexed node (the
    usual request of a nodeCacheCapable kube-scheduler): these set operations are most of what a
    request costs past decoding and encoding it."""
    index = ctx.index
    keys = tuple(k for k, _ in choice.homogeneity)
    li = ctx.li(choice.level)
    loc = choice.location
    # `feasible` is a subset of the indexed nodes, so the same size means the same set.
    whole = len(feasible) == len(index.names)
    bucket, good = _bucket(ctx, choice, feasible, whole=whole)
    split = bucket

    def rejected() -> dict[str, list[str]]:
        title = ctx.title(choice.level)
        out: dict[str, list[str]] = {}
        if len(split) == len(feasible):
            return out  # every feasible node is in the bucket
        if good is not None:
            # Turned away for their values: the feasible nodes outside `good` (`split` lies inside it).
            _off_values(ctx, choice, index.homogeneity(keys), None if whole else feasible - good, out)
            if choice.level == ANY:
                return out
            mine = good if whole else good & feasible
            # The group's values, elsewhere; none when the bucket holds them all (`split` lies in `mine`).
            rest = mine - split if len(mine) != len(split) else _NONE
        elif choice.level == ANY:
            return out
        else:
            rest = feasible - split
        if rest:
            unlab = rest & index.unlabelled[li]
            if unlab:
                out[f"no {title} label (the group is in {title} {loc})"] = list(unlab)
                rest = rest - unlab
            if rest:
                out[f"outside {title} {loc} of the group"] = list(rest)
        return out

    enclosing: list[tuple[str, str]] = []
    if enclose and bucket and choice.level != ANY:
        sample = ctx.snap.views[next(iter(bucket))]
        for j in range(li + 1, len(ctx.names)):
            value = sample.locations[j]
            if value is not None and bucket <= index.by_location[j].get(value, _NONE):
                enclosing.append((ctx.names[j], value))
    return _Answer(list(bucket), _Lazy(rejected), tuple(enclosing))


def _bucket(
    ctx: _Ctx, choice: Choice, feasible: AbstractSet[str], *, whole: bool
) -> tuple[AbstractSet[str], AbstractSet[str] | None]:
    """The feasible nodes of the choice's bucket, and the nodes of its homogeneity values (None when
    there are none to tell apart: no keys, or every node has the values). `whole`: `feasible` is every
    indexed node, so nothing is cut by it."""
    index = ctx.index
    keys = tuple(k for k, _ in choice.homogeneity)
    want = tuple(v for _, v in choice.homogeneity)
    li, loc = ctx.li(choice.level), choice.location
    parts: list[AbstractSet[str]] = [] if whole else [feasible]
    good: AbstractSet[str] | None = None
    if keys:
        h = index.homogeneity(keys)
        good = h.by_values.get(want, _NONE)
        if choice.level == ANY:
            parts.append(good)
        elif h.members:  # the bucket's nodes as the index keeps them
            parts.append(h.members[li].get((want, loc), _NONE))
        else:
            parts += [good, index.by_location[li].get(loc or "", _NONE)]
        if len(good) == len(index.names):
            good = None  # every node has these values: nothing to tell apart
    elif choice.level != ANY:
        parts.append(index.by_location[li].get(loc or "", _NONE))
    if not parts:
        return feasible, good
    parts.sort(key=len)  # smallest first: each intersection walks the smaller side
    bucket = parts[0]
    for part in parts[1:]:
        bucket = bucket & part
    return bucket, good


def _off_values(
    ctx: _Ctx, choice: Choice, h: HomogIndex, bad: AbstractSet[str] | None, out: dict[str, list[str]]
) -> None:
    """Give each node of `bad` (outside the group's homogeneity values) its reason: the first key whose
    value differs from the group's. `bad` None: every indexed node outside them (all are feasible).

    In a fleet of two GPU products half the nodes land here on every request, so nodes sharing a value
    tuple share their reason in one step per distinct tuple (a handful), not one Python step per node:
    when every node is feasible, the index's own set of each other tuple is that tuple's share; else
    one set operation per tuple, none at all with one other tuple and no node missing a key. Only nodes
    missing one of the keys, whose first differing key can vary, go node by node, as does everything
    when the tuples are as many as the nodes.
    """
    pairs = choice.homogeneity
    want = tuple(v for _, v in pairs)
    each: AbstractSet[str]
    if bad is None:
        for values, names in h.by_values.items():
            if values != want and names:
                k, v = next((k, v) for (k, v), have in zip(pairs, values, strict=True) if have != v)
                out.setdefault(f"the group needs {k}={v}", []).extend(names)
        each = h.missing
    else:
        each = bad
        if len(h.by_values) <= len(bad):
            others = [(values, names) for values, names in h.by_values.items() if values != want]
            each = bad & h.missing if h.missing else _NONE
            for values, names in others:
                hit: AbstractSet[str] = bad if len(others) == 1 and not each else names & bad
                if hit:
                    k, v = next((k, v) for (k, v), have in zip(pairs, values, strict=True) if have != v)
                    out.setdefault(f"the group needs {k}={v}", []).extend(hit)
    for name in each:
        labels = ctx.snap.views[name].labels
        k, v = next((k, v) for k, v in pairs if labels.get(k, "") != v)
        out.setdefault(f"the group needs {k}={v}", []).append(name)


# --- the decision -------------------------------------------------------------------------------


def decide(
    group: GroupRequest | None,
    feasible: AbstractSet[str],
    snap: Snapshot,
    config: ExtenderConfig,
    *,
    complete: bool = True,
) -> Decision:
    """Where this pod may go.

    `feasible`: the names of the nodes kube-scheduler passed, each one a node of `snap`. `complete`:
    False when kube-scheduler passed nodes the snapshot does not have; they may hold the group, so it
    then waits rather than "never fits".
    """
    if group is None:
        return Decision("pass-through", tuple(feasible), {}, False, "none", "not part of a group")
    absent = _absent_default_keys(group, snap)
    if absent:
        kept = tuple(k for k in group.homogeneous_keys if k not in absent)
        return _noted(
            decide(
                replace(group, homogeneous_keys=kept, default_keys=False),
                feasible,
                snap,
                config,
                complete=complete,
            ),
            "; ".join(f"homogeneity on {k} skipped: no node has it" for k in absent),
        )
    ctx = _Ctx(config, group, snap, complete)
    if group.choice is None and group.members:
        group = replace(group, choice=derive_choice(group, snap, config))
        ctx.group = group
    if group.choice is not None:
        return _follow(ctx, group.choice, feasible)
    return _choose(ctx, feasible)


def _absent_default_keys(group: GroupRequest, snap: Snapshot) -> Keys:
    """The default homogeneity keys no node of the cluster carries (the NVIDIA device plugin without GPU
    feature discovery publishes no product label): requiring them would make every group "never fit"."""
    if not group.default_keys or not group.homogeneous_keys:
        return ()
    return tuple(k for k in group.homogeneous_keys if not snap.carries(k))


def _noted(decision: Decision, note: str) -> Decision:
    """The decision with `note` added to its summary (and to its choice's, which later pods repeat)."""
    summary = f"{decision.summary}; {note}"
    choice = decision.choice
    if choice is not None and choice.summary == decision.summary:
        choice = replace(choice, summary=summary)
    return replace(decision, summary=summary, choice=choice)


def derive_choice(group: GroupRequest, snap: Snapshot, config: ExtenderConfig) -> Choice:
    """The bucket already-bound members imply when nothing else says (pods bound by another scheduler,
    or before this extender ran): the tightest level they all share."""
    ctx = _Ctx(config, group, snap)
    nodes = [snap.views[m] for m in group.members if m in snap.views]
    homog = tuple(
        (k, nodes[0].labels[k])
        for k in group.homogeneous_keys
        if nodes and nodes[0].labels.get(k) and len({n.labels.get(k) for n in nodes}) == 1
    )
    for level in _levels_for(group.locality, config):
        if level == ANY:
            break
        li = ctx.li(level)
        values = {n.locations[li] for n in nodes}
        if len(values) == 1 and None not in values:
            (location,) = values
            enclosing = _answer(ctx, Choice(level, location, ()), snap.index.names, enclose=True).enclosing
            where = ctx.where(level, location, enclosing)
            return Choice(level, location, homog, enclosing, f"members already run in {where}")
    return Choice(ANY, None, homog, (), "members already run in several locations")


def _ranked_feasible(ctx: _Ctx, feasible: AbstractSet[str]) -> Iterator[NodeView]:
    order = ctx.snap.ranked(ctx.group.rank)
    if len(feasible) == len(ctx.index.names):
        return iter(order)
    return (v for v in order if v.name in feasible)


def _fill(
    ctx: _Ctx, h: HomogIndex, li: int, candidates: AbstractSet[Bucket], feasible: AbstractSet[str]
) -> tuple[Bucket, list[str]]:
    """Walk the feasible nodes in rank order; the first candidate bucket to hold every remaining pod
    wins. A candidate holds them counting its feasible nodes, so the walk always ends in a winner."""
    need, shape, index = ctx.group.remaining, ctx.group.shape, ctx.index
    held: dict[Bucket, int] = {}
    used: dict[Bucket, list[str]] = {}
    # The walk is the decision's inner loop: the bucket and the slots of each node are read inline.
    value_of, at_level = h.value_of, li < h.levels
    for view in _ranked_feasible(ctx, feasible):
        values = value_of.get(view.name)
        if values is None:
            continue
        bucket = (values, view.locations[li] if at_level else None)
        if bucket not in candidates:
            continue
        s = index.slots(view, shape)
        total = held[bucket] = held.get(bucket, 0) + (s if s > 0 else 1)
        if bucket in used:
            used[bucket].append(view.name)
        else:
            used[bucket] = [view.name]
        if total >= need:
            return bucket, used[bucket]
    raise AssertionError("a candidate bucket did not fill")  # the capacities said it would


def _choose(ctx: _Ctx, feasible: AbstractSet[str]) -> Decision:
    group, index = ctx.group, ctx.index
    keys = group.homogeneous_keys
    h = index.homogeneity(keys)
    need, shape = group.remaining, group.shape
    skipped: list[str] = []
    for level in _levels_for(group.locality, ctx.config):
        li = ctx.li(level)
        title = ctx.title(level)
        if level != ANY and not index.by_location[li]:
            skipped.append(f"{level} level skipped: no node has a {title}")
            continue
        caps = index.capacities(h, li, shape, feasible)
        best = max(caps.values(), default=0)
        if best < need:
            if level == ANY:
                skipped.append(f"anywhere: largest {ctx.bucket_name(level)} holds {best} now")
            else:
                skipped.append(f"{level} level skipped: largest {title} holds {best} now")
            continue
        candidates = {b for b, total in caps.items() if total >= need}
        (values, location), planned = _fill(ctx, h, li, candidates, feasible)
        homog = tuple(zip(keys, values, strict=True))
        choice = Choice(level, location, homog)
        ans = _answer(ctx, choice, feasible, enclose=True)
        where = ctx.where(level, location, ans.enclosing)
        summary = (
            f"{need} of {group.size} pods of group {group.key} go to {where}{_describe_homog(homog)}"
            f" (nodes {name_nodes(planned)})"
        )
        if skipped:
            summary += "; " + "; ".join(skipped)
        choice = Choice(level, location, homog, ans.enclosing, summary)
        return Decision(
            "placed", tuple(ans.allowed), ans.rejected, False, level, summary, choice, tuple(planned)
        )
    return _wait_or_never(ctx, feasible, skipped)


def _ever_holds(ctx: _Ctx, level: str) -> int:
    """The most pods of the group one bucket of the level could ever hold: every node of the cluster
    the pods may use (node selector, required node affinity, taints, allocatable), counted empty."""
    group = ctx.group
    needs, shape, keys = group.needs, group.shape, group.homogeneous_keys
    li = ctx.li(level)
    at_level = level != ANY
    totals: dict[tuple[tuple[str, ...], str | None], int] = {}
    best = 0
    for view in ctx.snap.cluster.values():
        loc = view.locations[li] if at_level else None
        if at_level and loc is None:
            continue
        values = homog_values(view.labels, keys)
        if values is None:
            continue
        if view.record is not None and not needs.admits(view.record):
            continue
        s = shape.ever(view)
        if s <= 0:
            continue
        total = totals[(values, loc)] = totals.get((values, loc), 0) + s
        if total > best:
            best = total
            if best >= group.size:
                break
    return best


def _wait_or_never(ctx: _Ctx, feasible: AbstractSet[str], skipped: list[str]) -> Decision:
    group = ctx.group
    levels = _levels_for(group.locality, ctx.config)
    # Under prefer, "any location" holds whatever a tighter level could: it alone decides.
    level = levels[-1]
    bucket = ctx.bucket_name(level)
    largest = _ever_holds(ctx, level)
    ordered = sorted(feasible)
    if largest < group.size and ctx.complete:
        reason = f"never fits: no {bucket} can hold the {group.size} pods of group {group.key}"
        summary = f"{reason} (largest holds {largest}, counting every node the pods may use as empty)"
        return Decision("never-fits", (), {reason: ordered}, True, level, summary)
    wait = f"group {group.key} waits for one {bucket} with room for {group.remaining} pods"
    rejected: dict[str, list[str]] = {}
    li = ctx.li(level)
    h = ctx.index.homogeneity(group.homogeneous_keys)
    unlabelled = ctx.index.unlabelled[li] if level != ANY else _NONE
    for name in ordered:
        if name in unlabelled:
            reason = f"no {ctx.title(level)} label (group {group.key} requires one)"
        elif name in h.missing:
            view = ctx.snap.views[name]
            key = next(k for k in group.homogeneous_keys if not view.labels.get(k))
            reason = f"no {key} label (group {group.key} requires one)"
        else:
            reason = wait
        rejected.setdefault(reason, []).append(name)
    summary = f"{wait}; " + "; ".join(skipped) if skipped else wait
    return Decision("wait", (), rejected, False, level, summary)


def _follow(ctx: _Ctx, choice: Choice, feasible: AbstractSet[str]) -> Decision:
    """A later pod of a placed group: the chosen bucket, or under prefer the enclosing looser level."""
    group = ctx.group
    ans = _answer(ctx, choice, feasible)
    if ans.allowed:
        # A bucket read back from a claim whose decision text is gone still says where the group goes.
        summary = choice.summary or (
            f"group {group.key} goes to {ctx.where(choice.level, choice.location, choice.enclosing)}"
            f"{_describe_homog(choice.homogeneity)}"
        )
        return Decision("placed", tuple(ans.allowed), ans.rejected, False, choice.level, summary, choice)
    where = ctx.where(choice.level, choice.location, ())
    if group.locality == "prefer":
        widen = [*((lv, loc) for lv, loc in choice.enclosing), *([(ANY, "")] if choice.level != ANY else [])]
        for i, (level, location) in enumerate(widen):
            enclosing = choice.enclosing[i + 1 :]
            wider = Choice(level, location or None, choice.homogeneity, enclosing)
            ans = _answer(ctx, wider, feasible)
            if ans.allowed:
                summary = (
                    f"group {group.key} widened to {ctx.where(level, location or None, enclosing)}"
                    f"{_describe_homog(choice.homogeneity)}: {where} has no feasible node left"
                )
                wider = replace(wider, summary=summary)
                return Decision("placed", tuple(ans.allowed), ans.rejected, False, level, summary, wider)
    reason = f"group {group.key} waits for a feasible node in {where}{_describe_homog(choice.homogeneity)}"
    return Decision("wait", (), {reason: sorted(feasible)}, False, choice.level, reason, choice)
