"""The placement decision: a pure, deterministic function over a snapshot of the cluster.

Given the nodes kube-scheduler found feasible for one pod, every node of the cluster, the pod's group
(size, policy, the bucket chosen by an earlier pod, the members already bound) and the configuration,
`decide` returns the nodes the pod may use, a stable reason for every node turned away, and a summary
a person can read. Nothing here does I/O or reads a clock.

Vocabulary (ADR-0021, ADR-0004):
- level: fabric domain, network group, zone, region (configurable), tightest first; "any" last.
- bucket: the nodes sharing one (homogeneity values, location at a level). Nodes are taken in rank
  order and the first bucket to hold the group's remaining pods wins, so load balancing decides
  between equally close buckets.
- prefer never delays; a required level waits while no bucket fills and "never fits" when no bucket
  could hold the group in the whole cluster, ignoring load.

The hot path runs once per pod over up to thousands of nodes, so per-node work is kept to attribute
reads of values the cache precomputed (rank keys, level mask, homogeneity values).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from functools import reduce
from operator import attrgetter, or_
from typing import Literal

from nodefabric_operator.extender.config import ExtenderConfig

ANY = "any"
Outcome = Literal["placed", "wait", "never-fits", "pass-through"]


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node as the decision sees it. Built by the cache; `locations` follow `config.levels`."""

    name: str
    labels: Mapping[str, str]
    locations: tuple[str | None, ...]  # the node's value at each configured level, None when unlabelled
    free: Mapping[str, int]  # extended resource -> allocatable minus requested by bound pods
    allocatable: Mapping[str, int]  # extended resource -> allocatable
    # spread: accelerator share in use, then pods bound; most-free-memory: free accelerator memory (MiB),
    # then free host memory (bytes).
    load: tuple[float, int] = (0.0, 0)
    free_memory: tuple[int, int] = (0, 0)
    homog: tuple[str, ...] | None = None  # values of config.homogeneous_keys, when the cache computed them
    spread_key: tuple[float, int, str] = field(init=False)
    memory_key: tuple[int, int, str] = field(init=False)
    mask: int = field(init=False)  # bit i: the node has a value at level i

    def __post_init__(self) -> None:
        object.__setattr__(self, "spread_key", (self.load[0], self.load[1], self.name))
        object.__setattr__(self, "memory_key", (-self.free_memory[0], -self.free_memory[1], self.name))
        object.__setattr__(self, "mask", sum(1 << i for i, v in enumerate(self.locations) if v is not None))


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
    homogeneous_keys: tuple[str, ...]
    request: Mapping[str, int]  # extended resources one pod asks for
    choice: Choice | None = None
    members: tuple[str, ...] = ()  # nodes the group's bound pods run on
    # The pod's nodeSelector: nodes it can never use do not count when deciding "never fits".
    node_selector: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    allowed: tuple[str, ...]
    # reason -> the nodes turned away for it. Grouped because reasons are few and stable
    # (kube-scheduler counts identical strings) and the answer encodes them fastest that way.
    rejected: Mapping[str, Sequence[str]]
    unresolvable: bool  # rejected nodes go to FailedAndUnresolvableNodes: preemption cannot help
    level: str  # the level placed at, or the required level waited on; "none" for pass-through
    summary: str
    choice: Choice | None = None  # the group's bucket after this decision (new, kept or widened)

    @property
    def failed(self) -> dict[str, str]:
        """node -> reason, for every node turned away."""
        return {node: reason for reason, nodes in self.rejected.items() for node in nodes}


_NONE: frozenset[str] = frozenset()


@dataclass
class Index:
    """Node names by location at each level and by homogeneity values, kept current by the cache.

    With it, splitting thousands of feasible nodes into the bucket and the rest is a few set
    operations instead of a Python loop over every node.
    """

    by_location: list[dict[str, set[str]]]  # per level: value -> names
    unlabelled: list[set[str]]  # per level: names without a value
    by_homog: dict[tuple[str, ...], set[str]]  # values of config.homogeneous_keys -> names

    @classmethod
    def empty(cls, levels: int) -> Index:
        return cls([{} for _ in range(levels)], [set() for _ in range(levels)], {})

    @classmethod
    def of(cls, views: Iterable[NodeView], levels: int) -> Index:
        index = cls.empty(levels)
        for view in views:
            index.add(view)
        return index

    def add(self, view: NodeView) -> None:
        for i, value in enumerate(view.locations):
            if value is None:
                self.unlabelled[i].add(view.name)
            else:
                self.by_location[i].setdefault(value, set()).add(view.name)
        if view.homog is not None:
            self.by_homog.setdefault(view.homog, set()).add(view.name)

    def remove(self, view: NodeView) -> None:
        for i, value in enumerate(view.locations):
            bucket = self.unlabelled[i] if value is None else self.by_location[i].get(value, set())
            bucket.discard(view.name)
            if value is not None and not bucket:
                self.by_location[i].pop(value, None)
        if view.homog is not None:
            names = self.by_homog.get(view.homog)
            if names is not None:
                names.discard(view.name)
                if not names:
                    del self.by_homog[view.homog]


# --- ranking ------------------------------------------------------------------------------------

RANK_KEYS = {
    "spread": attrgetter("spread_key"),
    "first-fit": attrgetter("name"),
    "most-free-memory": attrgetter("memory_key"),
}


def rank_order(nodes: Iterable[NodeView], rank: str) -> list[NodeView]:
    return sorted(nodes, key=RANK_KEYS.get(rank, RANK_KEYS["spread"]))


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


def slots(free: Mapping[str, int], request: Mapping[str, int]) -> int:
    """How many pods of the group fit on a node; a pod without extended resources takes a whole node."""
    if not request:
        return 1
    return max(0, min(free.get(res, 0) // qty for res, qty in request.items()))


# --- helpers ------------------------------------------------------------------------------------


class _Ctx:
    """What one decision reads over and over, computed once."""

    def __init__(self, config: ExtenderConfig, group: GroupRequest) -> None:
        self.config = config
        self.group = group
        self.names = config.level_names
        self.titles = tuple(lv.label for lv in config.levels)
        self.keys = group.homogeneous_keys
        self.default_keys = self.keys == config.homogeneous_keys
        self.cluster: Mapping[str, NodeView] = {}
        self.index: Index | None = None
        self.feasible_names: AbstractSet[str] | None = None

    def li(self, level: str) -> int | None:
        return None if level == ANY else self.names.index(level)

    def title(self, level: str) -> str:
        return "location" if level == ANY else self.titles[self.names.index(level)]

    def hv(self, node: NodeView, keys: tuple[str, ...]) -> tuple[str, ...]:
        if node.homog is not None and (keys is self.keys and self.default_keys):
            return node.homog
        return tuple(node.labels.get(k, "") for k in keys)

    def where(self, level: str, location: str | None, enclosing: Sequence[tuple[str, str]]) -> str:
        if level == ANY or location is None:
            return "any location"
        text = f"{self.title(level)} {location}"
        for lv, loc in enclosing:
            text += f" of {self.title(lv)} {loc}"
        return text


def _describe_homog(pairs: tuple[tuple[str, str], ...]) -> str:
    shown = [f"{k}={v}" for k, v in pairs if v]
    return f" with {', '.join(shown)}" if shown else ""


def _levels_for(locality: str, config: ExtenderConfig) -> tuple[str, ...]:
    if locality == "prefer":
        return (*config.level_names, ANY)
    return (locality,)


@dataclass
class _Answer:
    allowed: list[str]
    rejected: Mapping[str, list[str]]
    enclosing: tuple[tuple[str, str], ...] = ()


def _answer(ctx: _Ctx, choice: Choice, feasible: Sequence[NodeView], *, enclose: bool = False) -> _Answer:
    """Split the feasible nodes into the bucket and the rest, with a reason for each of the rest.

    With `enclose`, also find the looser (level, location) pairs every allowed node shares.
    """
    if ctx.index is not None and ctx.feasible_names is not None:
        hkeys = tuple(k for k, _ in choice.homogeneity)
        if not hkeys or hkeys == ctx.config.homogeneous_keys:
            return _answer_by_sets(ctx, choice, ctx.index, ctx.feasible_names, enclose=enclose)
    hkeys = tuple(k for k, _ in choice.homogeneity)
    want = tuple(v for _, v in choice.homogeneity)
    pre = hkeys == ctx.config.homogeneous_keys  # the cache precomputed exactly these values
    li = ctx.li(choice.level)
    loc = choice.location
    title = ctx.title(choice.level)
    outside = f"outside {title} {loc} of the group"
    unlabelled = f"no {title} label (the group is in {title} {loc})"
    kept: list[NodeView] = []
    out: list[str] = []
    unlab: list[str] = []
    rejected: dict[str, list[str]] = {}
    for node in feasible:
        if hkeys:
            h = node.homog if pre else None
            if h is None:
                h = tuple(node.labels.get(k, "") for k in hkeys)
            if h != want:
                k, v = next((k, v) for k, v in choice.homogeneity if node.labels.get(k, "") != v)
                rejected.setdefault(f"the group needs {k}={v or '(unset)'}", []).append(node.name)
                continue
        if li is not None:
            nl = node.locations[li]
            if nl != loc:
                (unlab if nl is None else out).append(node.name)
                continue
        kept.append(node)
    enclosing: tuple[tuple[str, str], ...] = ()
    if enclose and kept and li is not None:
        tails = {n.locations[li + 1 :] for n in kept}
        shared = [vals.pop() if len(vals := set(col)) == 1 else None for col in zip(*tails, strict=True)]
        enclosing = tuple((ctx.names[li + 1 + j], v) for j, v in enumerate(shared) if v is not None)
    if out:
        rejected[outside] = out
    if unlab:
        rejected[unlabelled] = unlab
    return _Answer([n.name for n in kept], rejected, enclosing)


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


def _split_rejected(
    ctx: _Ctx,
    choice: Choice,
    index: Index,
    names: AbstractSet[str],
    *,
    bucket: AbstractSet[str],
    good: AbstractSet[str] | None,
    li: int | None,
) -> dict[str, list[str]]:
    title, loc = ctx.title(choice.level), choice.location
    rest = names - bucket if len(bucket) != len(names) else _NONE
    rejected: dict[str, list[str]] = {}
    if rest and good is not None:
        bad = rest - good
        if bad:
            for name in bad:  # which key differs can vary by node; rare, so per node
                labels = ctx.cluster[name].labels
                k, v = next((k, v) for k, v in choice.homogeneity if labels.get(k, "") != v)
                rejected.setdefault(f"the group needs {k}={v or '(unset)'}", []).append(name)
            rest = rest - bad
    if rest and li is not None:
        unlab = rest & index.unlabelled[li]
        if unlab:
            rejected[f"no {title} label (the group is in {title} {loc})"] = list(unlab)
            rest = rest - unlab
        if rest:
            rejected[f"outside {title} {loc} of the group"] = list(rest)
    return rejected


def _answer_by_sets(
    ctx: _Ctx, choice: Choice, index: Index, names: AbstractSet[str], *, enclose: bool
) -> _Answer:
    """_answer with the cache's index: the same split, as set operations."""
    want = tuple(v for _, v in choice.homogeneity)
    li = ctx.li(choice.level)
    loc = choice.location
    bucket: AbstractSet[str] = names
    if li is not None:
        bucket = index.by_location[li].get(loc or "", _NONE) & names
    good: AbstractSet[str] | None = None
    if want:
        good = index.by_homog.get(want, _NONE)
        if len(good) == len(ctx.cluster):
            good = None  # every node of the cluster has these values: nothing to check
        else:
            bucket = bucket & good
    split = bucket
    rejected = _Lazy(lambda: _split_rejected(ctx, choice, index, names, bucket=split, good=good, li=li))
    enclosing: list[tuple[str, str]] = []
    if enclose and bucket and li is not None:
        sample = ctx.cluster[next(iter(bucket))]
        for j in range(li + 1, len(ctx.names)):
            value = sample.locations[j]
            if value is not None and bucket <= index.by_location[j].get(value, _NONE):
                enclosing.append((ctx.names[j], value))
    return _Answer(list(bucket), rejected, tuple(enclosing))


# --- the decision -------------------------------------------------------------------------------


def decide(
    group: GroupRequest | None,
    feasible: Sequence[NodeView],
    cluster: Mapping[str, NodeView],
    config: ExtenderConfig,
    *,
    ranked: Iterable[NodeView] | None = None,
    present: int | None = None,
    index: Index | None = None,
    names: AbstractSet[str] | None = None,
) -> Decision:
    """Where this pod may go.

    `feasible`: the nodes kube-scheduler passed, in any order; `cluster`: every known node.
    Optional shortcuts a cache can give: `ranked`, the same nodes in the group's rank order (may be
    lazy: choosing a bucket usually reads only the first few); `present`, a bitmask of the levels at
    which at least one node of the cluster has a value (bit i for level i); `index` (of the whole
    cluster) with `names` (the feasible nodes' names) to split nodes by set operations.
    """
    if group is None:
        everyone = tuple(n.name for n in feasible)
        return Decision("pass-through", everyone, {}, False, "none", "not part of a group")
    ctx = _Ctx(config, group)
    ctx.cluster, ctx.index, ctx.feasible_names = cluster, index, names
    if group.choice is None and group.members:
        group = replace(group, choice=derive_choice(group, cluster, config))
        ctx.group = group
    if group.choice is not None:
        return _follow(ctx, group.choice, feasible)
    if ranked is None:
        ranked = rank_order(feasible, group.rank)
    if present is None:
        present = reduce(or_, map(attrgetter("mask"), feasible), 0)
    return _choose(ctx, feasible, iter(ranked), present, cluster)


def derive_choice(group: GroupRequest, cluster: Mapping[str, NodeView], config: ExtenderConfig) -> Choice:
    """The bucket already-bound members imply (after a restart): the tightest level they all share."""
    ctx = _Ctx(config, group)
    nodes = [cluster[m] for m in group.members if m in cluster]
    homog = tuple(
        (k, nodes[0].labels.get(k, ""))
        for k in group.homogeneous_keys
        if nodes and len({n.labels.get(k, "") for n in nodes}) == 1
    )
    for level in _levels_for(group.locality, config):
        li = ctx.li(level)
        if li is None:
            break
        values = {n.locations[li] for n in nodes}
        if len(values) == 1 and None not in values:
            (location,) = values
            assert location is not None
            bucket = [n for n in cluster.values() if n.locations[li] == location]
            enclosing = _answer(ctx, Choice(level, location, ()), bucket, enclose=True).enclosing
            where = ctx.where(level, location, enclosing)
            return Choice(level, location, homog, enclosing, f"members already run in {where}")
    return Choice(ANY, None, homog, (), "members already run in several locations")


def _choose(
    ctx: _Ctx,
    feasible: Sequence[NodeView],
    ranked: Iterator[NodeView],
    present: int,
    cluster: Mapping[str, NodeView],
) -> Decision:
    group, keys, request = ctx.group, ctx.keys, ctx.group.request
    single = next(iter(request.items())) if len(request) == 1 else None
    # (node, pod slots on it, homogeneity values), computed lazily: a level usually fills early.
    items: list[tuple[NodeView, int, tuple[str, ...]]] = []
    skipped: list[str] = []
    need = group.remaining
    for level in _levels_for(group.locality, ctx.config):
        li = ctx.li(level)
        title = ctx.title(level)
        if li is not None and not present >> li & 1:
            skipped.append(f"{level} level skipped: no node has a {title}")
            continue
        buckets: dict[tuple[tuple[str, ...], str | None], int] = {}
        winner: tuple[tuple[str, ...], str | None] | None = None
        i = 0
        while True:
            if i == len(items):
                node = next(ranked, None)
                if node is None:
                    break
                if single is not None:
                    s = node.free.get(single[0], 0) // single[1]
                else:
                    s = slots(node.free, request)
                # kube-scheduler found the node feasible for this pod, which is fresher than a cache
                # that may lag a deletion: it holds at least one pod.
                items.append((node, s if s > 0 else 1, ctx.hv(node, keys)))
            node, s, hv = items[i]
            i += 1
            loc = node.locations[li] if li is not None else None
            if li is not None and loc is None:
                continue
            total = buckets.get((hv, loc), 0) + s
            buckets[(hv, loc)] = total
            if total >= need:
                winner = (hv, loc)
                break
        if winner is not None:
            homog = tuple(zip(keys, winner[0], strict=True))
            choice = Choice(level, winner[1], homog)
            ans = _answer(ctx, choice, feasible, enclose=True)
            where = ctx.where(level, winner[1], ans.enclosing)
            summary = (
                f"{need} of {group.size} pods of group {group.key} go to {where}{_describe_homog(homog)}"
            )
            if skipped:
                summary += "; " + "; ".join(skipped)
            choice = replace(choice, enclosing=ans.enclosing, summary=summary)
            return Decision("placed", tuple(ans.allowed), ans.rejected, False, level, summary, choice)
        skipped.append(f"{level} level skipped: largest {title} holds {max(buckets.values(), default=0)}")

    ordered = [item[0] for item in items] + list(ranked)  # every feasible node, in rank order
    if group.locality == "prefer":
        return _best_effort(ctx, ordered, skipped)
    return _wait_or_never(ctx, ordered, cluster, skipped)


def _best_effort(ctx: _Ctx, ordered: Sequence[NodeView], skipped: list[str]) -> Decision:
    """prefer never delays: keep the group homogeneous on the class with most room, ignore location."""
    group = ctx.group
    room: dict[tuple[str, ...], int] = {}
    for node in ordered:
        hv = ctx.hv(node, ctx.keys)
        room[hv] = room.get(hv, 0) + max(1, slots(node.free, group.request))
    if not room:
        return Decision("wait", (), {}, False, ANY, f"group {group.key}: no feasible node")
    best = max(room.items(), key=lambda kv: kv[1])  # first maximum in rank order: deterministic
    homog = tuple(zip(ctx.keys, best[0], strict=True))
    summary = (
        f"only {best[1]} of {group.remaining} pods of group {group.key} fit now"
        f"{_describe_homog(homog)}; placed without locality; " + "; ".join(skipped)
    )
    choice = Choice(ANY, None, homog, (), summary)
    ans = _answer(ctx, choice, ordered)
    return Decision("placed", tuple(ans.allowed), ans.rejected, False, ANY, summary, choice)


def _capacity_fits(ctx: _Ctx, cluster: Iterable[NodeView], li: int | None) -> tuple[bool, int]:
    """Could any bucket at the level ever hold the group, counting every node at full allocatable?"""
    group = ctx.group
    totals: dict[tuple[tuple[str, ...], str | None], int] = {}
    selector = group.node_selector
    for node in cluster:
        loc = node.locations[li] if li is not None else None
        if li is not None and loc is None:
            continue
        if selector and any(node.labels.get(k) != v for k, v in selector):
            continue
        k = (ctx.hv(node, ctx.keys), loc)
        totals[k] = totals.get(k, 0) + slots(node.allocatable, group.request)
        if totals[k] >= group.size:
            return True, totals[k]
    return False, max(totals.values(), default=0)


def _wait_or_never(
    ctx: _Ctx, ordered: Sequence[NodeView], cluster: Mapping[str, NodeView], skipped: list[str]
) -> Decision:
    group = ctx.group
    level = group.locality
    li = ctx.li(level)
    title = ctx.title(level)
    homog_text = f" of one {', '.join(ctx.keys)}" if ctx.keys else ""
    fits, largest = _capacity_fits(ctx, cluster.values(), li)
    if not fits:
        reason = f"never fits: no {title}{homog_text} can hold the {group.size} pods of group {group.key}"
        summary = f"{reason} (largest holds {largest}, counting every node empty)"
        return Decision("never-fits", (), {reason: [n.name for n in ordered]}, True, level, summary)
    wait = f"group {group.key} waits for one {title}{homog_text} with room for {group.remaining} pods"
    unlabelled = f"no {title} label (group {group.key} requires one)"
    rejected: dict[str, list[str]] = {}
    for n in ordered:
        rejected.setdefault(unlabelled if li is not None and n.locations[li] is None else wait, []).append(
            n.name
        )
    summary = f"{wait}; {skipped[-1]}" if skipped else wait
    return Decision("wait", (), rejected, False, level, summary)


def _follow(ctx: _Ctx, choice: Choice, feasible: Sequence[NodeView]) -> Decision:
    """A later pod of a placed group: the chosen bucket, or under prefer the enclosing looser level."""
    group = ctx.group
    ans = _answer(ctx, choice, feasible)
    if ans.allowed:
        return Decision(
            "placed", tuple(ans.allowed), ans.rejected, False, choice.level, choice.summary, choice
        )
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
    return Decision("wait", (), {reason: [n.name for n in feasible]}, False, choice.level, reason, choice)
