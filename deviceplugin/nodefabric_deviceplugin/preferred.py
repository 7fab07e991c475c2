"""GetPreferredAllocation: which of kubelet's candidate tokens to grant.

Order of preference: distinct endpoints before a second token of one endpoint (shared: two holders on
one adapter share its bandwidth), then the set of endpoints whose slowest pairwise link is closest (same
switch, same NUMA node; `nodefabric_devicemanager.distance` decides), then the lowest ids. The set search
is `nodefabric_devicemanager.pick.best_set`, the one the accelerator pick uses.
"""

from __future__ import annotations

from collections.abc import Sequence

from nodefabric_devicemanager.distance import distance
from nodefabric_devicemanager.pick import best_set, link_rank
from nodefabric_deviceplugin.resources import FamilyView, RdmaEndpoint, Token

# pick.best_set is exact (branch and bound); past this many candidates its worst case is out of reach of
# an admission-time call, so larger pools (VFs) take the greedy walk below.
EXACT_LIMIT = 16
# Distinct placements (switch path, host bridge, NUMA node) past which no ranking is attempted.
CLASS_LIMIT = 64
_NO_MUST = 1 << 30


def pair_rank(a: RdmaEndpoint, b: RdmaEndpoint) -> int:
    """Bigger is closer, in the accelerator pick's scale."""
    return link_rank(distance(a, b).name)


def _signature(e: RdmaEndpoint) -> tuple[object, ...]:
    """Everything distance reads: endpoints with one signature are interchangeable for ranking."""
    return (bool(e.pci_bus_id), e.pci_switches, e.pci_host_bridge, e.numa_affinity)


def _choose_endpoints(
    endpoints: Sequence[RdmaEndpoint], must: Sequence[RdmaEndpoint], count: int
) -> list[RdmaEndpoint]:
    """`count` endpoints from `endpoints` (ordered lowest ids first) that best join the `must` ones."""
    n = len(endpoints)
    if count <= 0:
        return []
    if count >= n:
        return list(endpoints)
    signatures = [_signature(e) for e in endpoints]
    classes: dict[tuple[object, ...], int] = {}
    reps: list[RdmaEndpoint] = []
    for e, sig in zip(endpoints, signatures, strict=True):
        if sig not in classes:
            classes[sig] = len(reps)
            reps.append(e)
    if len(reps) > CLASS_LIMIT:
        # So many distinct placements is no machine's; ranking them would hold the event loop for seconds.
        return list(endpoints[:count])
    cls = [classes[sig] for sig in signatures]
    class_rank = [[pair_rank(a, b) for b in reps] for a in reps]
    # The slowest link of must + S is the slowest of: links inside must (fixed), each member's slowest
    # link to must, and links inside S. Folding the second into every pair of S keeps the search exact.
    class_to_must = [min((pair_rank(r, m) for m in must), default=_NO_MUST) for r in reps]
    joint = [
        [min(class_rank[c][d], class_to_must[c], class_to_must[d]) for d in range(len(reps))]
        for c in range(len(reps))
    ]
    if count == 1:
        return [endpoints[max(range(n), key=lambda i: (class_to_must[cls[i]], -i))]]
    if n <= EXACT_LIMIT:
        chosen = best_set(range(n), count, lambda i, j: joint[cls[i]][cls[j]])
    else:
        chosen = _greedy(cls, joint, count)
    return [endpoints[i] for i in chosen]


def _greedy(cls: list[int], joint: list[list[int]], count: int) -> list[int]:
    """From one seed per class, add the candidate whose slowest link to the set is fastest (then most
    total, then lowest index); keep the best set by the pick's own order.

    Endpoints of one class rank alike with everything, so the walk runs over classes (taking each class's
    lowest free endpoint): the work grows with classes x count, not with endpoints x count.
    """
    members: list[list[int]] = [[] for _ in joint]
    for i, c in enumerate(cls):
        members[c].append(i)
    k = len(joint)
    best: tuple[int, int, list[int]] | None = None
    result: list[int] = []
    for seed in range(k):
        taken = [0] * k
        taken[seed] = 1
        slowest = list(joint[seed])
        total = list(joint[seed])
        for _ in range(count - 1):
            pick = max(
                (c for c in range(k) if taken[c] < len(members[c])),
                key=lambda c: (slowest[c], total[c], -members[c][taken[c]]),
            )
            taken[pick] += 1
            row = joint[pick]
            for c in range(k):
                slowest[c] = min(slowest[c], row[c])
                total[c] += row[c]
        chosen = sorted(i for c in range(k) for i in members[c][: taken[c]])
        worst, links = _class_score(joint, taken)
        key = (worst, links, [-i for i in chosen])
        if best is None or key > best:
            best, result = key, chosen
    return result


def _class_score(joint: list[list[int]], taken: list[int]) -> tuple[int, int]:
    """(slowest pair, total) of a set holding taken[c] endpoints of each class c."""
    used = [c for c, t in enumerate(taken) if t]
    worst = _NO_MUST
    links = 0
    for a, c in enumerate(used):
        if taken[c] > 1:
            worst = min(worst, joint[c][c])
            links += taken[c] * (taken[c] - 1) // 2 * joint[c][c]
        for d in used[a + 1 :]:
            worst = min(worst, joint[c][d])
            links += taken[c] * taken[d] * joint[c][d]
    return worst, links


def preferred(
    view: FamilyView, available: Sequence[str], must_include: Sequence[str], size: int
) -> list[str]:
    """The preferred ids: every must-include id, then up to `size` in all from `available`.

    Ids that are not tokens of the family (a record change since kubelet's list) are never preferred;
    kubelet intersects the answer with its candidates anyway, so a short answer only means "no opinion".
    """
    result: list[str] = list(dict.fromkeys(must_include))
    # Sets, not the lists: kubelet sends every free token (a hundred thousand on a shared node), and a
    # look-up in a list per token held the event loop, every family's stream with it, for minutes.
    must = set(result)
    free: list[Token] = sorted(
        (view.by_id[i] for i in dict.fromkeys(available) if i in view.by_id and i not in must),
        key=lambda t: t.order,
    )
    need = size - len(result)
    if need <= 0 or not free:
        return result

    must_eps = list({t.endpoint.key: t.endpoint for t in (view.by_id.get(i) for i in result) if t}.values())
    must_keys = {e.key for e in must_eps}
    fresh: dict[str, RdmaEndpoint] = {}
    for t in free:
        if t.endpoint.key not in must_keys:
            fresh.setdefault(t.endpoint.key, t.endpoint)
    endpoints = list(fresh.values())
    chosen = _choose_endpoints(endpoints, must_eps, min(need, len(endpoints)))

    # One token per chosen endpoint first, then further tokens round-robin over every endpoint in use
    # (must ones included), so a second holder lands on the adapter with the fewest.
    by_endpoint: dict[str, list[Token]] = {}
    for t in free:
        by_endpoint.setdefault(t.endpoint.key, []).append(t)
    picked: list[str] = []
    for ep in chosen:
        picked.append(by_endpoint[ep.key].pop(0).id)
    in_use = [e.key for e in must_eps] + [e.key for e in chosen]
    while len(picked) < need and any(by_endpoint.get(k) for k in in_use):
        for k in in_use:
            if len(picked) < need and by_endpoint.get(k):
                picked.append(by_endpoint[k].pop(0).id)
    # Only possible when must-include endpoints had no free tokens left: fall back to the lowest ids.
    taken = set(picked)
    leftovers = [t.id for t in free if t.id not in taken]
    picked.extend(leftovers[: need - len(picked)])
    return result + picked
