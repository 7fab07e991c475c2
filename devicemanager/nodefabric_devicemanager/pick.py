"""Choosing the best-connected set of free devices inside one machine.

A collective runs at the speed of its slowest link, so the chosen set is the one whose slowest link is
fastest; among those, the one with the most total link speed; among those, the lowest indices. The
search is exact, not greedy: a greedy walk from every start can miss a set whose best member is not the
best start.

How, for up to 20 devices (every machine there is; see `search`): the slowest link by clique searches
over the graph of fast links, then the total by meeting in the middle, where Python's big integers add
up every completion of a partial choice at once, lane by lane. 8 of 16 devices with random links takes
well under a millisecond, where a branch and bound took up to 11 (hack/bench_pick.py measures both).
The rank matrix of a link matrix is computed once per topology and cached.

Past 20 devices an exact search is exponential (16 of 32 with random links took a minute), so `choose`
works to a budget of search steps (`SEARCH_BUDGET`, counted, never timed, so the same request always
gets the same answer): a greedy walk from every start, improved by swaps, gives a set at once; the
clique and branch-and-bound searches then try to prove it best, or better it, within what is left. An
answer the searches finished is exact; one they did not is the best set found, and says so.

The core, `best_set`, is generic over a "rank of a pair" function (bigger is faster) so the device plugin
can reuse it for NICs; `pick` applies it to a link matrix in the distance vocabulary (NV<n>, PIX, ... SYS).
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

# peer index -> link name, per device index: {0: {1: "NV18", 2: "SYS"}, ...}
LinkMatrix = Mapping[int, Mapping[int, str]]
RankFn = Callable[[int, int], int]

# Slowest to fastest. A direct fabric link of unknown width (LINK) beats any PCIe path; NV<n> ranks
# above it, wider bonds faster. Unknown or missing data ranks lowest rather than failing the pick.
_PCIE_RANK = {"UNK": 0, "SYS": 1, "NODE": 2, "PHB": 3, "PXB": 4, "PIX": 5, "LINK": 6}
_NV = re.compile(r"NV([0-9]{1,3})", re.ASCII)
NV_BASE = 6  # NV<n> ranks NV_BASE + n


@functools.lru_cache(maxsize=256)
def link_rank(name: str) -> int:
    """Speed order of one link name (bigger is faster). Unknown names rank as UNK."""
    name = name.strip().upper()
    m = _NV.fullmatch(name)
    if m is not None:
        return NV_BASE + int(m[1])
    return _PCIE_RANK.get(name, 0)


def known_link(name: str) -> bool:
    """Whether a name is part of the link vocabulary (NV<n>, LINK, PIX, PXB, PHB, NODE, SYS, UNK), whole:
    a trailing newline or space is not, nor a look-alike that str.upper() turns into one ("p\u0131x")."""
    if not name.isascii():
        return False
    name = name.upper()
    return name in _PCIE_RANK or _NV.fullmatch(name) is not None


@dataclass(frozen=True, slots=True)
class Choice:
    """A chosen set and why: its slowest link and its total link rank (higher is better)."""

    indices: list[int]
    slowest: int  # rank of the slowest pair; -1 when the set has no pair
    total: int


def score(indices: Sequence[int], rank: RankFn) -> Choice:
    pairs = [rank(a, b) for i, a in enumerate(indices) for b in indices[i + 1 :]]
    return Choice(list(indices), min(pairs) if pairs else -1, sum(pairs))


def best_set(candidates: Iterable[int], count: int, rank: RankFn) -> list[int]:
    """The `count` candidates whose slowest pair rank is highest, then highest total, then lowest indices.

    `rank(a, b)` must be symmetric. Raises ValueError for a count the candidates cannot meet.
    """
    cands = sorted(set(candidates))
    _check_count(count, len(cands))
    if count <= 1:
        return cands[:count]
    n = len(cands)
    r = [[0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            r[i][j] = r[j][i] = rank(cands[i], cands[j])
    return [cands[i] for i in search(r, count)]


def _check_count(count: int, free: int) -> None:
    if count < 0:
        raise ValueError(f"count must be positive, got {count}")
    if count > free:
        raise ValueError(f"asked for {count} devices but only {free} are free")


# Past this many devices the lane arithmetic's tables outgrow their worth (2**(n - n*3//8) lanes); the
# branch and bound takes over, exact too, slower.
MEET_IN_THE_MIDDLE_LIMIT = 20


# The most devices one pick chooses among: twice the largest machine there is (16 GPUs). The rank
# matrix, the greedy walk and the swaps grow with its square and cube; past it they alone would outgrow
# the time bound (hack/bench_pick.py), so `pick` refuses more.
MAX_DEVICES = 32

# Search steps one `choose` may take: a greedy candidate weighed, a swap tried, a node of the clique or
# branch-and-bound search. Counted rather than timed, so a request's answer never depends on the load.
# hack/bench_pick.py times the worst layouts it knows at this budget (README, "Choosing GPUs").
SEARCH_BUDGET = 100_000


class _OutOfBudget(Exception):
    """The search spent its steps: what it found so far is the best found, not proven best."""


class _Steps:
    __slots__ = ("left",)

    def __init__(self, steps: int) -> None:
        self.left = steps

    def spend(self, steps: int = 1) -> None:
        self.left -= steps
        if self.left < 0:
            raise _OutOfBudget


_UNBOUNDED = 1 << 62


@dataclass(frozen=True, slots=True)
class Found:
    """A search's answer: the positions chosen, ascending, and whether the search proved them best
    (exact) or ran out of steps first (the best set it found)."""

    positions: list[int]
    exact: bool


def search(r: Sequence[Sequence[int]], count: int) -> list[int]:
    """The exact choice over a symmetric rank matrix (positions 0..n-1) for `2 <= count <= n`:
    the positions, ascending. Unbounded: past MEET_IN_THE_MIDDLE_LIMIT devices it can take minutes."""
    n = len(r)
    if count >= n:
        return list(range(n))
    if n > MEET_IN_THE_MIDDLE_LIMIT:
        return branch_and_bound(r, count)
    return _most_total(r, count, slowest_link(r, count))


def search_within(r: Sequence[Sequence[int]], count: int, budget: int = SEARCH_BUDGET) -> Found:
    """The choice `search` makes, within `budget` steps: exact when the searches finish in it, otherwise
    the best set found (the greedy walk's, bettered by swaps and by whatever the searches reached).

    Where the lane search is small (`lane_work`, at most LANE_WORK_LIMIT) it runs, and only the clique
    search for the slowest link is counted; where every set can be weighed within the budget, every set
    is; otherwise the greedy set comes first and seeds the searches, which then prove it best or better
    it.
    """
    n = len(r)
    if count >= n:
        return Found(list(range(n)), True)
    if count <= 1:
        return Found(list(range(count)), True)
    if n <= MEET_IN_THE_MIDDLE_LIMIT and lane_work(n, count) <= LANE_WORK_LIMIT:
        try:
            threshold, _ = _slowest(r, count, _Steps(budget))
        except _OutOfBudget:
            return Found(_swaps(r, _greedy(r, count, _Steps(budget // 2)), _Steps(budget // 2)), False)
        return Found(_most_total(r, count, threshold), True)
    # Where every set can be weighed within the budget, weigh them: exact, whatever the layout.
    if math.comb(n, count) * count * count <= budget:
        return Found(_every_set(r, count), True)
    # A quarter of the steps for the greedy walks, a quarter for the swaps, the rest (and what those
    # left) for the searches that prove the set best or better it.
    steps = _Steps(budget // 4)
    best = _greedy(r, count, steps)
    steps.left += budget // 4
    best = _swaps(r, best, steps)
    steps.left += budget - 2 * (budget // 4)
    slowest, total = _key(r, best)
    bb: _BranchAndBound | None = None
    try:
        threshold, clique = _slowest(r, count, steps, floor=slowest)
        if clique is not None:
            best = sorted(clique)
            slowest, total = _key(r, best)
        # Every set at the threshold with at least the best total, the lowest of the most total first:
        # the best set itself qualifies, so a finished search always has one.
        bb = _BranchAndBound(r, count, threshold, steps, total - 1)
        bb.run()
    except _OutOfBudget:
        # The branch and bound's best so far may still beat the greedy set.
        if bb is not None and bb.best is not None and _better(r, bb.best, best):
            best = bb.best
        return Found(best, False)
    assert bb.best is not None
    return Found(bb.best, True)


# The most lane work (`lane_work`) a bounded pick spends on the lane search: 9 of 18 or 5 of 20 (about
# 300,000, a few ms), where 10 of 20 (a million, 20-70 ms on a loaded 2-core machine) takes the bounded
# route instead.
LANE_WORK_LIMIT = 320_000


def lane_work(n: int, count: int) -> int:
    """The size of the lane search for `count` of `n` devices: subsets of A times lanes per subset."""
    na = n * 3 // 8
    nb = n - na
    return (1 << na) * sum(math.comb(nb, c) for c in range(max(0, count - na), min(count, nb) + 1))


def _every_set(r: Sequence[Sequence[int]], count: int) -> list[int]:
    """The best set by weighing every one (in lexicographic order, so only a strictly better one
    replaces the best)."""
    best: list[int] = []
    best_key = (-2, -1)
    for combo in itertools.combinations(range(len(r)), count):
        key = _key(r, combo)
        if key > best_key:
            best, best_key = list(combo), key
    return best


def _better(r: Sequence[Sequence[int]], a: list[int], b: list[int]) -> bool:
    """Whether set a beats set b: slowest link, then total, then lower indices."""
    ka, kb = _key(r, a), _key(r, b)
    return ka > kb or (ka == kb and a < b)


def _key(r: Sequence[Sequence[int]], chosen: Sequence[int]) -> tuple[int, int]:
    """(slowest pair rank, total rank) of a set of positions."""
    pairs = [r[a][b] for i, a in enumerate(chosen) for b in chosen[i + 1 :]]
    return (min(pairs) if pairs else -1, sum(pairs))


def _greedy(r: Sequence[Sequence[int]], count: int, steps: _Steps) -> list[int]:
    """From each start (the best-connected first, while steps last), add the device whose slowest link to
    the set is fastest, then most total, then lowest; keep the best set by the pick's own order. Never
    raises: the first walk always runs to the end (about 3 x count x n steps)."""
    n = len(r)
    top = max(max(row) for row in r) + 1
    scale = top * n  # above any total of one device's links to the set, so the slowest link decides first
    starts = sorted(range(n), key=lambda i: (-sorted(r[i])[n - count], -sum(r[i]), i))
    best: list[int] = []
    for start in starts:
        if best and steps.left <= 0:
            break
        steps.left -= 3 * count * n  # three passes over a row per device added
        chosen = [start]
        slow = list(r[start])
        total = list(r[start])
        value = [x * scale + x for x in slow]
        value[start] = -1
        for _ in range(count - 1):
            pick = value.index(max(value))  # the first maximum: the lowest index among equals
            chosen.append(pick)
            row = r[pick]
            slow = [a if a < b else b for a, b in zip(slow, row, strict=True)]
            total = [a + b for a, b in zip(total, row, strict=True)]
            value = [s * scale + t for s, t in zip(slow, total, strict=True)]
            for c in chosen:
                value[c] = -1
        chosen.sort()
        if not best or _better(r, chosen, best):
            best = chosen
    return best


def _swaps(r: Sequence[Sequence[int]], chosen: list[int], steps: _Steps) -> list[int]:
    """Swap one member for one outsider while that betters the set (slowest, then total, then lower
    indices) and steps last: the best swap of each round."""
    n = len(r)
    current = sorted(chosen)
    slowest, total = _key(r, current)
    while steps.left > 0:
        k = len(current)
        steps.left -= k * k * (n - k)  # every swap weighs the member's row against the rest
        members = set(current)
        outside = [v for v in range(n) if v not in members]
        to_set = [sum(r[x][w] for w in current) for x in range(n)]
        pairs = sorted((r[a][b], a, b) for i, a in enumerate(current) for b in current[i + 1 :])
        better: tuple[int, int, int, int] | None = None  # (slowest, total, u - v, ...) of the best swap
        swap = (0, 0)
        for u in current:
            # The slowest pair the set keeps without u.
            kept = next((p[0] for p in pairs if u != p[1] and u != p[2]), _UNBOUNDED)
            rest = [w for w in current if w != u]
            for v in outside:
                row = r[v]
                worst = min(kept, *(row[w] for w in rest))
                # u - v > 0: the swap lowers the indices, the last tie-break.
                new = (worst, total - to_set[u] + to_set[v] - row[u], u - v, -u)
                if new[:3] > (slowest, total, 0) and (better is None or new > better):
                    better, swap = new, (u, v)
        if better is None:
            break
        slowest, total = better[0], better[1]
        u, v = swap
        current = sorted([*(w for w in current if w != u), v])
    return current


def branch_and_bound(r: Sequence[Sequence[int]], count: int) -> list[int]:
    """The same choice by branch and bound, threshold by threshold: what `search` did before the lanes,
    and still does past MEET_IN_THE_MIDDLE_LIMIT devices (hack/bench_pick.py times it as the baseline)."""
    n = len(r)
    for threshold in sorted({r[i][j] for i in range(n) for j in range(i + 1, n)}, reverse=True):
        bb = _BranchAndBound(r, count, threshold, _Steps(_UNBOUNDED))
        bb.run()
        if bb.best is not None:
            return bb.best
    raise AssertionError("the lowest threshold always admits a set")  # pragma: no cover


def slowest_link(r: Sequence[Sequence[int]], count: int) -> int:
    """The highest rank t such that `count` devices are pairwise linked at t or faster (a clique of the
    graph of links >= t)."""
    return _slowest(r, count, _Steps(_UNBOUNDED))[0]


def _slowest(
    r: Sequence[Sequence[int]], count: int, steps: _Steps, floor: int | None = None
) -> tuple[int, list[int] | None]:
    """`slowest_link` and a clique there, counting steps; only ranks above `floor` (a set already found
    has it) are searched, and (floor, None) is the answer when none of them admits a set. The graphs of
    fast links are sparse: most thresholds are refuted by dropping, repeatedly, every device with fewer
    than count-1 such links."""
    n = len(r)
    by_rank: dict[int, list[int]] = {}
    for i in range(n):
        row = r[i]
        for j in range(i + 1, n):
            masks = by_rank.get(row[j])
            if masks is None:
                masks = by_rank[row[j]] = [0] * n
            masks[i] |= 1 << j
            masks[j] |= 1 << i
    adj = [0] * n
    for t in sorted(by_rank, reverse=True):
        if floor is not None and t <= floor:
            return floor, None
        adj = [a | b for a, b in zip(adj, by_rank[t], strict=True)]
        steps.spend(4 * n)
        alive = _core(adj, (1 << n) - 1, count - 1)
        if alive.bit_count() >= count:
            clique = _clique(adj, alive, count, steps)
            if clique is not None:
                return t, clique
    raise AssertionError("the lowest rank admits every set")  # pragma: no cover


def _core(adj: list[int], alive: int, degree: int) -> int:
    changed = True
    while changed:
        changed = False
        rest = alive
        while rest:
            low = rest & -rest
            rest ^= low
            if (adj[low.bit_length() - 1] & alive).bit_count() < degree:
                alive ^= low
                changed = True
    return alive


def _clique(adj: list[int], cand: int, need: int, steps: _Steps) -> list[int] | None:
    """`need` members of `cand`, pairwise adjacent, or None."""
    if need == 0:
        return []
    while cand.bit_count() >= need:
        steps.spend(4)
        low = cand & -cand
        cand ^= low
        v = low.bit_length() - 1
        rest = _clique(adj, cand & adj[v], need - 1, steps)
        if rest is not None:
            return [v, *rest]
    return None


@dataclass(frozen=True, slots=True)
class _Lanes:
    """Every subset of `nb` devices with `low`..`high` members as one lane of a big integer, ordered by
    size, then lexicographically, so a size is a contiguous run of lanes whose first best lane is its
    lowest subset. Sizes no set can use are left out, which also keeps the lanes narrow."""

    low: int
    subsets: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]  # lanes of size c: offsets[c - low] .. offsets[c - low + 1]
    member: tuple[int, ...]  # member[b]: 1 in every lane whose subset holds b
    pairs: dict[tuple[int, int], int]  # 1 in every lane holding both
    ones: int  # 1 in every lane
    guard_of_size: tuple[int, ...]  # the top bit of every lane of size c (index c - low)
    width: int
    nbytes: int

    def of_size(self, c: int) -> slice:
        return slice(self.offsets[c - self.low], self.offsets[c - self.low + 1])


@functools.lru_cache(maxsize=16)
def _lanes(nb: int, low: int, high: int, width: int) -> _Lanes:
    subsets: list[tuple[int, ...]] = []
    offsets = [0]
    for c in range(low, high + 1):
        subsets.extend(itertools.combinations(range(nb), c))
        offsets.append(len(subsets))
    step = width // 8
    count = len(subsets)
    lane_one = b"\x01" + bytes(step - 1)
    lane_top = bytes(step - 1) + b"\x80"
    # One pass over the subsets sets every member's byte; the rest are runs of whole lanes.
    member_bytes = [bytearray(step * count) for _ in range(nb)]
    for lane, subset in enumerate(subsets):
        for b in subset:
            member_bytes[b][step * lane] = 1
    member = tuple(int.from_bytes(m, "little") for m in member_bytes)
    sizes = range(len(offsets) - 1)
    return _Lanes(
        low=low,
        subsets=tuple(subsets),
        offsets=tuple(offsets),
        member=member,
        pairs={(b, c): member[b] & member[c] for b in range(nb) for c in range(b + 1, nb)},
        ones=int.from_bytes(lane_one * count, "little"),
        guard_of_size=tuple(
            int.from_bytes(bytes(step * offsets[c]) + lane_top * (offsets[c + 1] - offsets[c]), "little")
            for c in sizes
        ),
        width=width,
        nbytes=step * len(subsets),
    )


def _lane_values(value: int, lanes: _Lanes) -> memoryview[int]:
    raw = memoryview(value.to_bytes(lanes.nbytes, "little"))
    if lanes.width == 16:
        return raw.cast("H")
    return raw.cast("I") if lanes.width == 32 else raw.cast("Q")


def _most_total(r: Sequence[Sequence[int]], count: int, threshold: int) -> list[int]:
    """Among the `count`-sets whose every link is >= threshold: the most total, then the lowest.

    Split the devices: A, the lowest n*3/8 positions, and B, the rest. A set is a subset SA of A and a
    subset SB of B of the remaining size, and its total is total(SA) + [total(SB) + links(SA, SB)]. The
    bracket, for every SB at once, is one big integer with a lane per subset of B: the lanes of B's own
    totals plus, per member a of SA, a's lanes of links into each SB. So each SA costs a few big-integer
    additions, and a guard-bit test says whether any SB of the right size can reach the best total so
    far; only then are that size's lanes read out. A link at or above the threshold carries a bonus
    larger than any total, so where a clique exists a lane with a slower link is never the best.
    """
    n = len(r)
    na = n * 3 // 8
    nb = n - na
    low, high = max(0, count - na), min(count, nb)  # the sizes of SB a set can have
    pairs = count * (count - 1) // 2
    top_rank = max(0, *(max(row) for row in r))
    bonus = pairs * top_rank + 1
    # A lane may sum the links of up to na + high devices (an SA too big for it, read by no one): that,
    # too, must stay below the lane's top bit, or its carry would spoil the next lane.
    crowd = (na + high) * (na + high - 1) // 2
    width = next(w for w in (16, 32, 64) if crowd * (bonus + top_rank) < 1 << (w - 1))
    lanes = _lanes(nb, low, high, width)
    weight = [[x + bonus if x >= threshold else x for x in row] for row in r]
    best, reaching = _sweep(weight, na, count, lanes)
    assert best >= pairs * bonus, "a clique exists at the threshold"

    found: list[int] | None = None
    for sa, value, lane in reaching:
        c = count - sa.bit_count()
        where = lanes.of_size(c)
        first = where.start + _lane_values(value, lanes)[where].tolist().index(lane)
        chosen = [a for a in range(na) if sa >> a & 1] + [na + b for b in lanes.subsets[first]]
        if found is None or chosen < found:
            found = chosen
    assert found is not None
    return found


def _sweep(
    weight: list[list[int]], na: int, count: int, lanes: _Lanes
) -> tuple[int, list[tuple[int, int, int]]]:
    """The best total, and every (SA mask, its lanes, best lane) that reaches it.

    The lanes of SA hold whole totals: B's own links, SA's links into B and SA's own links (added to
    every lane), so one test per SA, against a constant that changes only with the best, says whether a
    lane of the right size reaches the best: adding guard - best sets a lane's top bit exactly then.
    """
    nb = len(weight) - na
    ones = lanes.ones
    into_b = [sum(weight[a][na + b] * lanes.member[b] for b in range(nb)) for a in range(na)]
    base = sum(weight[na + b][na + c] * mask for (b, c), mask in lanes.pairs.items())
    guard = 1 << (lanes.width - 1)
    size = 1 << na
    # within[h][m]: h's links to the members of m (a subset of 0..h-1), in every lane.
    within: list[list[int]] = []
    for h in range(na):
        row = [0] * (1 << h)
        for m in range(1, 1 << h):
            low = m & -m
            row[m] = row[m ^ low] + weight[h][low.bit_length() - 1] * ones
        within.append(row)
    # Subsets of A in increasing mask order: each one's parent (without its highest member) came first.
    totals = [base] + [0] * (size - 1)
    best = -1
    reach = 0  # added to a lane, sets its top bit when the lane reaches the best
    reaching: list[tuple[int, int, int]] = []
    for sa in range(size):
        if sa:
            high = sa.bit_length() - 1
            parent = sa ^ (1 << high)
            totals[sa] = totals[parent] + into_b[high] + within[high][parent]
        c = count - sa.bit_count()
        if not lanes.low <= c <= nb:
            continue
        value = totals[sa]
        if best >= 0 and not (value + reach) & lanes.guard_of_size[c - lanes.low]:
            continue
        lane = max(_lane_values(value, lanes)[lanes.of_size(c)])
        if lane > best:
            best, reaching = lane, [(sa, value, lane)]
            reach = (guard - best) * ones
        elif lane == best:
            reaching.append((sa, value, lane))
    return best, reaching


class _BranchAndBound:
    """Among `count`-sets with every pair ranked >= threshold and a total above `floor`: the highest
    total, then the lowest indices (`best`, None when no set qualifies). The search past
    MEET_IN_THE_MIDDLE_LIMIT devices; each node is a step, and `best` holds the best so far when the
    steps run out.

    Depth-first in increasing index order, so the first set found at a given total is the lowest one;
    a branch is cut when even its optimistic bound cannot beat the best total strictly.
    """

    def __init__(
        self, r: Sequence[Sequence[int]], count: int, threshold: int, steps: _Steps, floor: int = -(1 << 62)
    ) -> None:
        n = len(r)
        self.r = r
        self.n = n
        self.count = count
        self.steps = steps
        self.adj = [0] * n
        self.row_max = [0] * n
        for i in range(n):
            for j in range(n):
                if i != j and r[i][j] >= threshold:
                    self.adj[i] |= 1 << j
                    self.row_max[i] = max(self.row_max[i], r[i][j])
        self.best_total = floor  # only a set above it is taken
        self.best: list[int] | None = None
        self.chosen: list[int] = []
        self.ceiling = max(self.row_max) * count * (count - 1) // 2

    def run(self) -> None:
        self._search((1 << self.n) - 1, 0, [0] * self.n)

    def _bound(self, cand: int, to_chosen: list[int], need: int) -> int:
        # Each future member adds its links to the chosen set (take the best `need` of those), and each
        # pair of future members at most the fastest link any candidate has.
        members = [v for v in range(self.n) if cand >> v & 1]
        gains = sorted((to_chosen[v] for v in members), reverse=True)[:need]
        top = max(self.row_max[v] for v in members)
        return sum(gains) + top * need * (need - 1) // 2

    def _search(self, cand: int, total: int, to_chosen: list[int]) -> None:
        self.steps.spend(4 * self.n)  # the bound reads and sorts a row
        chosen = self.chosen
        need = self.count - len(chosen)
        if need == 0:
            if total > self.best_total:
                self.best_total, self.best = total, list(chosen)
            return
        if cand.bit_count() < need or total + self._bound(cand, to_chosen, need) <= self.best_total:
            return
        r = self.r
        for v in [v for v in range(self.n) if cand >> v & 1]:
            if self.best_total >= self.ceiling:
                return  # nothing can beat a set whose every pair is the fastest link there is
            # Only later indices stay candidates, so every set is visited once and in lexicographic order.
            rest = cand & self.adj[v] & ~((1 << (v + 1)) - 1)
            if rest.bit_count() < need - 1:
                continue
            chosen.append(v)
            row = r[v]
            self._search(rest, total + to_chosen[v], [a + b for a, b in zip(to_chosen, row, strict=True)])
            chosen.pop()


def matrix_rank(links: LinkMatrix) -> RankFn:
    """A pair-rank function over a link matrix; a pair either side reports is taken, slower side wins."""

    def rank(a: int, b: int) -> int:
        ab = links.get(a, {}).get(b)
        ba = links.get(b, {}).get(a)
        seen = [link_rank(x) for x in (ab, ba) if x is not None]
        return min(seen) if seen else 0

    return rank


Topology = tuple[tuple[int, tuple[tuple[int, str], ...]], ...]


def topology(links: LinkMatrix) -> Topology:
    """A link matrix as a hashable value: the key the rank matrix is cached under."""
    return tuple(sorted((a, tuple(sorted(row.items()))) for a, row in links.items()))


@dataclass(frozen=True, slots=True)
class RankMatrix:
    """Every pair's rank of one topology (by `matrix_rank`'s rule), as rows over its devices."""

    devices: tuple[int, ...]
    position: dict[int, int]
    rows: tuple[tuple[int, ...], ...]

    def among(self, devices: Sequence[int]) -> Sequence[Sequence[int]]:
        """The ranks among `devices` (a device with no links ranks 0 with every other)."""
        if tuple(devices) == self.devices:
            return self.rows
        at = [self.position.get(d) for d in devices]
        zeros = (0,) * len(devices)
        return [zeros if i is None else [0 if j is None else self.rows[i][j] for j in at] for i in at]


@functools.lru_cache(maxsize=64)
def rank_matrix(key: Topology) -> RankMatrix:
    """The rank matrix of one topology, computed once per topology."""
    links = {a: dict(row) for a, row in key}
    rank = matrix_rank(links)
    devices = tuple(sorted({a for a, _ in key} | {b for _, row in key for b, _ in row}))
    rows = [[0] * len(devices) for _ in devices]
    for i, a in enumerate(devices):
        for j in range(i + 1, len(devices)):
            rows[i][j] = rows[j][i] = rank(a, devices[j])
    return RankMatrix(devices, {d: i for i, d in enumerate(devices)}, tuple(tuple(row) for row in rows))


@dataclass(frozen=True, slots=True)
class Picked:
    """A pick's answer: the devices, ascending, and whether the search proved them the best set (exact)
    or spent its budget first (the best set it found; see `SEARCH_BUDGET`)."""

    indices: list[int]
    exact: bool


def choose(links: LinkMatrix, free: Iterable[int], count: int, budget: int = SEARCH_BUDGET) -> Picked:
    """The free set of `count` devices whose slowest link is fastest, then most total speed, then lowest,
    within `budget` search steps, and whether it is proven best.

    One device, or no link data at all, keeps the lowest free indices. Raises ValueError for a count the
    free devices cannot meet, a negative index, or more than MAX_DEVICES devices (free or in `links`).
    """
    free_sorted = sorted(set(free))
    if any(i < 0 for i in free_sorted):
        raise ValueError(f"device indices are never negative: {free_sorted}")
    _check_count(count, len(free_sorted))
    _check_size(len(free_sorted), "free devices")
    if count <= 1 or not any(links.get(i) for i in free_sorted):
        return Picked(free_sorted[:count], True)
    _check_size(len(links), "devices in the link matrix")
    r = rank_matrix(topology(links)).among(free_sorted)
    found = search_within(r, count, budget)
    return Picked([free_sorted[i] for i in found.positions], found.exact)


def _check_size(devices: int, what: str) -> None:
    if devices > MAX_DEVICES:
        raise ValueError(f"{devices} {what}: a pick chooses among at most {MAX_DEVICES} devices")


def pick(links: LinkMatrix, free: Iterable[int], count: int) -> list[int]:
    """`choose`'s devices, for callers that do not ask whether they are proven best."""
    return choose(links, free, count).indices


def lowest(free: Iterable[int], count: int) -> list[int]:
    """The baseline: the lowest free indices."""
    return sorted(set(free))[:count]
