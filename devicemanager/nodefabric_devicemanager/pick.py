"""Choosing the best-connected set of free devices inside one machine.

A collective runs at the speed of its slowest link, so the chosen set is the one whose slowest link is
fastest; among those, the one with the most total link speed; among those, the lowest indices. The
search is exact (branch and bound over bitmasks), not greedy: a greedy walk from every start can miss a
set whose best member is not the best start, and for up to 16 devices exact costs little more.

The core, `best_set`, is generic over a "rank of a pair" function (bigger is faster) so the device plugin
can reuse it for NICs; `pick` applies it to a link matrix in the distance vocabulary (NV<n>, PIX, ... SYS).
"""

from __future__ import annotations

import functools
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
    if count < 0:
        raise ValueError(f"count must be positive, got {count}")
    if count > len(cands):
        raise ValueError(f"asked for {count} devices but only {len(cands)} are free")
    if count <= 1:
        return cands[:count]
    n = len(cands)
    r = [[0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            r[i][j] = r[j][i] = rank(cands[i], cands[j])
    for threshold in sorted({r[i][j] for i in range(n) for j in range(i + 1, n)}, reverse=True):
        found = _best_clique(r, n, count, threshold)
        if found is not None:
            return [cands[i] for i in found]
    raise AssertionError("the lowest threshold always admits a set")  # pragma: no cover


def _best_clique(r: list[list[int]], n: int, count: int, threshold: int) -> list[int] | None:
    """Among `count`-sets with every pair ranked >= threshold: the highest total, then the lowest indices.

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


def pick(links: LinkMatrix, free: Iterable[int], count: int) -> list[int]:
    """The free set of `count` devices whose slowest link is fastest, then most total speed, then lowest.

    One device, or no link data at all, keeps the lowest free indices.
    """
    free_sorted = sorted(set(free))
    if any(i < 0 for i in free_sorted):
        raise ValueError(f"device indices are never negative: {free_sorted}")
    if count <= 1 or not any(links.get(i) for i in free_sorted):
        if count < 0 or count > len(free_sorted):
            return best_set(free_sorted, count, lambda a, b: 0)  # raises the same clear error
        return free_sorted[:count]
    return best_set(free_sorted, count, matrix_rank(links))


def lowest(free: Iterable[int], count: int) -> list[int]:
    """The baseline: the lowest free indices."""
    return sorted(set(free))[:count]
