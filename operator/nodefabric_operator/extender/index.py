"""Node views and the indexes a decision reads instead of walking every node.

A NodeView is one node as the decision sees it, built once per change by the cache. The Index keeps,
current with every change the watches deliver:
- node names per location at each level, and the unlabelled ones;
- per homogeneity key tuple: names per value tuple, the names missing a value, and for every level the
  count of nodes per (values, location) bucket and free-resource vector. A bucket's room for a pod shape
  is then a sum over a handful of distinct vectors, so "can any fabric domain hold 64 pods?" is answered
  without visiting 5,000 nodes.
Nothing here does I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from nodefabric_operator.extender.nodes import NodeRecord

Keys = tuple[str, ...]  # homogeneity label keys
Values = tuple[str, ...]  # a node's values of those keys
Bucket = tuple[Values, str | None]  # (homogeneity values, location; None at the "any" level)
FreeKey = tuple[tuple[str, int], ...]
# Key tuples indexed beyond the configured ones (a group's own `homogeneous` annotation): least
# recently used go first, so pods cannot grow the extender's memory by inventing keys.
EXTRA_KEY_TUPLES = 16
_MEMO_CAP = 4096


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node as the decision sees it. `locations` follow `config.levels`."""

    name: str
    labels: Mapping[str, str]
    locations: tuple[str | None, ...]  # the node's value at each configured level, None when unlabelled
    free: Mapping[str, int]  # extended resource -> allocatable minus requested by bound pods
    allocatable: Mapping[str, int]  # extended resource -> allocatable
    # spread: accelerator share in use, then pods bound; most-free-memory: free accelerator memory (MiB),
    # then free host memory (bytes).
    load: tuple[float, int] = (0.0, 0)
    free_memory: tuple[int, int] = (0, 0)
    # (cpu millicores, memory bytes, pod slots): what is left, and the node's allocatable; they count for
    # pods that ask for no extended resource (0 where the node does not say).
    spare: tuple[int, int, int] = (0, 0, 0)
    size: tuple[int, int, int] = (0, 0, 0)
    # The node's taints, cpu and memory, for "could this node ever run the pod"; None: the node as
    # given admits every pod (only tests build views without one).
    record: NodeRecord | None = None
    spread_key: tuple[float, int, str] = field(init=False)
    memory_key: tuple[int, int, str] = field(init=False)
    free_key: FreeKey = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "spread_key", (self.load[0], self.load[1], self.name))
        object.__setattr__(self, "memory_key", (-self.free_memory[0], -self.free_memory[1], self.name))
        object.__setattr__(self, "free_key", tuple(sorted(self.free.items())))


def homog_values(labels: Mapping[str, str], keys: Keys) -> Values | None:
    """The node's values of `keys`; None when one is missing: an unknown value never satisfies."""
    values = tuple(labels.get(k, "") for k in keys)
    return None if "" in values else values


def slots(free: Mapping[str, int], request: Mapping[str, int]) -> int:
    """How many pods asking `request` (extended resources) fit in `free`."""
    return max(0, min(free.get(res, 0) // qty for res, qty in request.items()))


@dataclass(frozen=True, slots=True)
class Shape:
    """What one pod of a group takes from a node, as the room counts go.

    A pod asking for extended resources (GPUs, RDMA endpoints) is counted by those alone: they are what a
    GPU node runs out of, and counting them per free-resource vector keeps the capacity index small.
    Kube-scheduler's own filter has already held each node to the pod's cpu and memory. A pod asking
    none (CPU-only jobs, kind) is counted by cpu, memory and pod slots.
    """

    request: Mapping[str, int]  # extended resources
    cpu: int = 0  # millicores
    memory: int = 0  # bytes
    key: FreeKey = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", tuple(sorted(self.request.items())))

    def general(self, room: tuple[int, int, int], size: tuple[int, int, int]) -> int:
        caps = []
        if size[2] > 0:
            caps.append(room[2])
        if self.cpu > 0 and size[0] > 0:
            caps.append(room[0] // self.cpu)
        if self.memory > 0 and size[1] > 0:
            caps.append(room[1] // self.memory)
        return max(0, min(caps)) if caps else 1  # nothing said: one pod per node

    def now(self, view: NodeView) -> int:
        """Pods that fit on the node as it is."""
        if self.request:
            return slots(view.free, self.request)
        return self.general(view.spare, view.size)

    def ever(self, view: NodeView) -> int:
        """Pods that would fit on the node were it empty."""
        if self.request:
            return slots(view.allocatable, self.request)
        return self.general(view.size, view.size)


@dataclass
class HomogIndex:
    """Everything the decision needs about one homogeneity key tuple, at every level."""

    keys: Keys
    levels: int
    by_values: dict[Values, set[str]] = field(default_factory=dict)
    missing: set[str] = field(default_factory=set)
    value_of: dict[str, Values | None] = field(default_factory=dict)
    # Per level (the last one is "any"): bucket -> free vector -> nodes with it.
    vectors: list[dict[Bucket, dict[FreeKey, int]]] = field(default_factory=list)
    # Per configured level: bucket -> its nodes, for the key tuples the configuration names (`track`;
    # empty for others). A placed group's every request splits the nodes by its bucket; reading the
    # bucket here spares intersecting a location's nodes with a value tuple's (both thousands of names
    # on a large fleet), for about 4 MiB at 20,000 nodes. At "any", a bucket's nodes are `by_values`.
    track: bool = False
    members: list[dict[Bucket, set[str]]] = field(default_factory=list)
    version: int = 0
    memo: dict[tuple[int, FreeKey], tuple[int, dict[Bucket, int]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.vectors = [{} for _ in range(self.levels + 1)]
        self.members = [{} for _ in range(self.levels)] if self.track else []

    def add(self, view: NodeView) -> None:
        self.version += 1
        values = homog_values(view.labels, self.keys)
        self.value_of[view.name] = values
        if values is None:
            self.missing.add(view.name)
            return
        self.by_values.setdefault(values, set()).add(view.name)
        for li, loc in enumerate((*view.locations, None)):
            if loc is None and li < self.levels:
                continue
            counts = self.vectors[li].setdefault((values, loc), {})
            counts[view.free_key] = counts.get(view.free_key, 0) + 1
            if li < self.levels and self.track:
                self.members[li].setdefault((values, loc), set()).add(view.name)

    def remove(self, view: NodeView) -> None:
        self.version += 1
        values = self.value_of.pop(view.name, None)
        if values is None:
            self.missing.discard(view.name)
            return
        names = self.by_values.get(values)
        if names is not None:
            names.discard(view.name)
            if not names:
                del self.by_values[values]
        for li, loc in enumerate((*view.locations, None)):
            if loc is None and li < self.levels:
                continue
            bucket = (values, loc)
            if li < self.levels and self.track:
                names = self.members[li].get(bucket)
                if names is not None:
                    names.discard(view.name)
                    if not names:
                        del self.members[li][bucket]
            counts = self.vectors[li].get(bucket)
            if counts is None:
                continue
            left = counts.get(view.free_key, 0) - 1
            if left > 0:
                counts[view.free_key] = left
            else:
                counts.pop(view.free_key, None)
                if not counts:
                    del self.vectors[li][bucket]

    def bucket_of(self, view: NodeView, li: int) -> Bucket | None:
        values = self.value_of.get(view.name)
        if values is None:
            return None
        loc = view.locations[li] if li < self.levels else None
        if loc is None and li < self.levels:
            return None
        return (values, loc)


class Index:
    """Node names by location and by homogeneity values, with per-bucket room, kept current by the cache."""

    def __init__(self, levels: int, pinned: Iterable[Keys] = ()) -> None:
        self.levels = levels
        self.by_location: list[dict[str, set[str]]] = [{} for _ in range(levels)]
        self.unlabelled: list[set[str]] = [set() for _ in range(levels)]
        self.names: set[str] = set()
        self.names_version = 0  # changes when a node comes or goes (not when one changes)
        self.views: dict[str, NodeView] = {}
        self.pinned = tuple(dict.fromkeys(pinned))
        # The configured tuples keep their buckets' nodes; the empty tuple's would be `by_location`.
        self.homog: OrderedDict[Keys, HomogIndex] = OrderedDict(
            (k, HomogIndex(k, levels, track=bool(k))) for k in self.pinned
        )
        # Nodes carrying each configured homogeneity key: whether a default key is carried at all is
        # read on every decision, so it is counted as nodes come and go rather than scanned.
        self.carriers: dict[str, int] = {key: 0 for keys in self.pinned for key in keys}
        self._slots: dict[tuple[FreeKey, FreeKey], int] = {}

    @classmethod
    def of(cls, views: Iterable[NodeView], levels: int, pinned: Iterable[Keys] = ()) -> Index:
        index = cls(levels, pinned)
        for view in views:
            index.add(view)
        return index

    def add(self, view: NodeView) -> None:
        old = self.views.get(view.name)
        if old is not None:
            self._unindex(old)
        else:
            self.names_version += 1
        self.views[view.name] = view
        self.names.add(view.name)
        for i, value in enumerate(view.locations):
            if value is None:
                self.unlabelled[i].add(view.name)
            else:
                self.by_location[i].setdefault(value, set()).add(view.name)
        for h in self.homog.values():
            h.add(view)
        for key in self.carriers:
            if view.labels.get(key):
                self.carriers[key] += 1

    def carries(self, key: str) -> bool:
        """Whether any indexed node has the label `key` with a value."""
        count = self.carriers.get(key)
        if count is not None:
            return count > 0
        return any(v.labels.get(key) for v in self.views.values())

    def remove(self, view: NodeView) -> None:
        if self.views.get(view.name) is not view:
            return
        self.names_version += 1
        self._unindex(view)

    def _unindex(self, view: NodeView) -> None:
        del self.views[view.name]
        self.names.discard(view.name)
        for i, value in enumerate(view.locations):
            if value is None:
                self.unlabelled[i].discard(view.name)
                continue
            names = self.by_location[i].get(value)
            if names is not None:
                names.discard(view.name)
                if not names:
                    del self.by_location[i][value]
        for h in self.homog.values():
            h.remove(view)
        for key in self.carriers:
            if view.labels.get(key):
                self.carriers[key] -= 1

    def homogeneity(self, keys: Keys) -> HomogIndex:
        """The index of `keys`, built on first use (one pass over the nodes) and kept current after."""
        h = self.homog.get(keys)
        if h is not None:
            self.homog.move_to_end(keys)
            return h
        h = HomogIndex(keys, self.levels)
        for view in self.views.values():
            h.add(view)
        self.homog[keys] = h
        extra = [k for k in self.homog if k not in self.pinned]
        while len(extra) > EXTRA_KEY_TUPLES:
            del self.homog[extra.pop(0)]
        return h

    def slots(self, view: NodeView, shape: Shape) -> int:
        """Pods of the shape the node holds now; a feasible node holds at least one (below)."""
        if not shape.request:
            return shape.now(view)
        key = (view.free_key, shape.key)
        s = self._slots.get(key)
        if s is None:
            if len(self._slots) > _MEMO_CAP:
                self._slots.clear()
            s = self._slots[key] = slots(view.free, shape.request)
        return s

    def capacities(
        self, h: HomogIndex, li: int, shape: Shape, feasible: AbstractSet[str]
    ) -> dict[Bucket, int]:
        """Pods of one shape each bucket at level `li` holds now, counting only the feasible nodes.

        A node kube-scheduler found feasible holds at least one pod even when the cache says it is full
        (the cache may lag a deletion), the same rule the choice itself applies.
        """
        request, req_key = shape.request, shape.key
        if not request:  # counted by cpu, memory and pod slots: no vector is shared, so node by node
            out: dict[Bucket, int] = {}
            for name in feasible:
                view = self.views[name]
                found = h.bucket_of(view, li)
                if found is not None:
                    s = shape.now(view)
                    out[found] = out.get(found, 0) + (s if s > 0 else 1)
            return out
        memo = h.memo.get((li, req_key))
        if memo is not None and memo[0] == h.version:
            totals = memo[1]
        else:
            totals = {}
            for bucket, counts in h.vectors[li].items():
                total = 0
                for free_key, n in counts.items():
                    s = slots(dict(free_key), request)
                    total += n * (s if s > 0 else 1)
                totals[bucket] = total
            if len(h.memo) > 64:
                h.memo.clear()
            h.memo[(li, req_key)] = (h.version, totals)
        if len(feasible) == len(self.names):
            return totals
        views = self.views
        if len(self.names) - len(feasible) <= len(feasible):
            out = dict(totals)
            for name in self.names.difference(feasible):
                view = views[name]
                found = h.bucket_of(view, li)
                if found is not None:
                    s = self.slots(view, shape)
                    out[found] -= s if s > 0 else 1
            return out
        out = {}
        for name in feasible:
            view = views[name]
            found = h.bucket_of(view, li)
            if found is not None:
                s = self.slots(view, shape)
                out[found] = out.get(found, 0) + (s if s > 0 else 1)
        return out
