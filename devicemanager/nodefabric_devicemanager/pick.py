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

The core, `best_set`, is generic over a "rank of a pair" function (bigger is faster) so the device plugin
can reuse it for NICs; `pick` applies it to a link matrix in the distance vocabulary (NV<n>, PIX, ... SYS).
"""

from __future__ import annotations

import functools
import itertools
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
    a trailing newline or space is not."""
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


def search(r: Sequence[Sequence[int]], count: int) -> list[int]:
    """The exact choice over a symmetric rank matrix (positions 0..n-1) for `2 <= count <= n`:
    the positions, ascending."""
    n = len(r)
    if count >= n:
        return list(range(n))
    if n > MEET_IN_THE_MIDDLE_LIMIT:
        return branch_and_bound(r, count)
    return _most_total(r, count, slowest_link(r, count))


def branch_and_bound(r: Sequence[Sequence[int]], count: int) -> list[int]:
    """The same choice by branch and bound, threshold by threshold: what `search` did before the lanes,
    and still does past MEET_IN_THE_MIDDLE_LIMIT devices (hack/bench_pick.py times it as the baseline)."""
    n = len(r)
    matrix = [list(row) for row in r]
    for threshold in sorted({r[i][j] for i in range(n) for j in range(i + 1, n)}, reverse=True):
        found = _best_clique(matrix, n, count, threshold)
        if found is not None:
            return found
    raise AssertionError("the lowest threshold always admits a set")  # pragma: no cover


def slowest_link(r: Sequence[Sequence[int]], count: int) -> int:
    """The highest rank t such that `count` devices are pairwise linked at t or faster (a clique of the
    graph of links >= t). The graphs of fast links are sparse: most thresholds are refuted by dropping,
    repeatedly, every device with fewer than count-1 such links."""
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
        adj = [a | b for a, b in zip(adj, by_rank[t], strict=True)]
        alive = _core(adj, (1 << n) - 1, count - 1)
        if alive.bit_count() >= count and _clique_in(adj, alive, count):
            return t
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


def _clique_in(adj: list[int], cand: int, need: int) -> bool:
    if need == 0:
        return True
    while cand.bit_count() >= need:
        low = cand & -cand
        cand ^= low
        if _clique_in(adj, cand & adj[low.bit_length() - 1], need - 1):
            return True
    return False


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


def _best_clique(r: list[list[int]], n: int, count: int, threshold: int) -> list[int] | None:
    """Among `count`-sets with every pair ranked >= threshold: the highest total, then the lowest indices.
    The branch and bound used past MEET_IN_THE_MIDDLE_LIMIT devices.

    Depth-first in increasing index order, so the first set found at a given total is the lowest one;
    a branch is cut when even its optimistic bound cannot beat the best total strictly.
    """
    adj = [0] * n
    row_max = [0] * n
    for i in range(n):
        for j in range(n):
            if i != j and r[i][j] >= threshold:
                adj[i] |= 1 << j
                row_max[i] = max(row_max[i], r[i][j])
    best_total = -(1 << 62)  # below any total, so a first set is always taken
    best: list[int] | None = None
    chosen: list[int] = []

    def bound(cand: int, to_chosen: list[int], need: int) -> int:
        # Each future member adds its links to the chosen set (take the best `need` of those), and each
        # pair of future members at most the fastest link any candidate has.
        members = [v for v in range(n) if cand >> v & 1]
        gains = sorted((to_chosen[v] for v in members), reverse=True)[:need]
        top = max(row_max[v] for v in members)
        return sum(gains) + top * need * (need - 1) // 2

    def search(cand: int, total: int, to_chosen: list[int]) -> None:
        nonlocal best_total, best
        need = count - len(chosen)
        if need == 0:
            if total > best_total:
                best_total, best = total, list(chosen)
            return
        if cand.bit_count() < need or total + bound(cand, to_chosen, need) <= best_total:
            return
        for v in [v for v in range(n) if cand >> v & 1]:
            if best_total >= ceiling:
                return  # nothing can beat a set whose every pair is the fastest link there is
            # Only later indices stay candidates, so every set is visited once and in lexicographic order.
            rest = cand & adj[v] & ~((1 << (v + 1)) - 1)
            if rest.bit_count() < need - 1:
                continue
            chosen.append(v)
            nxt = [to_chosen[w] + r[v][w] for w in range(n)]
            search(rest, total + to_chosen[v], nxt)
            chosen.pop()

    ceiling = max(row_max) * count * (count - 1) // 2
    search((1 << n) - 1, 0, [0] * n)
    return best


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


def pick(links: LinkMatrix, free: Iterable[int], count: int) -> list[int]:
    """The free set of `count` devices whose slowest link is fastest, then most total speed, then lowest.

    One device, or no link data at all, keeps the lowest free indices.
    """
    free_sorted = sorted(set(free))
    if any(i < 0 for i in free_sorted):
        raise ValueError(f"device indices are never negative: {free_sorted}")
    _check_count(count, len(free_sorted))
    if count <= 1 or not any(links.get(i) for i in free_sorted):
        return free_sorted[:count]
    r = rank_matrix(topology(links)).among(free_sorted)
    return [free_sorted[i] for i in search(r, count)]


def lowest(free: Iterable[int], count: int) -> list[int]:
    """The baseline: the lowest free indices."""
    return sorted(set(free))[:count]
