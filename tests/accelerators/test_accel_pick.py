"""pick: the free set whose slowest link is fastest, then most total speed, then lowest indices."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from nodefabric_devicemanager.accelerators import topo
from nodefabric_devicemanager.pick import (
    MAX_DEVICES,
    Picked,
    best_set,
    branch_and_bound,
    choose,
    link_rank,
    lowest,
    matrix_rank,
    pick,
    rank_matrix,
    score,
    topology,
)

LINKS = ["NV1", "NV2", "NV4", "NV12", "NV18", "PIX", "PXB", "PHB", "NODE", "SYS"]


def brute_force(links, free, count):
    rank = matrix_rank(links)
    best = None
    for combo in itertools.combinations(sorted(free), count):
        s = score(combo, rank)
        key = (s.slowest, s.total)
        # combinations() yields in lexicographic order, so only a strictly better key replaces the best.
        if best is None or key > best[0]:
            best = (key, list(combo))
    return best[1]


def random_matrix(rng, n, vocabulary):
    m = {i: {} for i in range(n)}
    for i in range(n):
        for j in range(i + 1, n):
            m[i][j] = m[j][i] = rng.choice(vocabulary)
    return m


def test_link_order_is_nvlink_widest_first_then_pcie_levels():
    order = ["NV18", "NV12", "NV2", "NV1", "LINK", "PIX", "PXB", "PHB", "NODE", "SYS", "UNK"]
    ranks = [link_rank(x) for x in order]
    assert ranks == sorted(ranks, reverse=True)
    assert len(set(ranks)) == len(ranks)
    assert link_rank("garbage") == link_rank("UNK")


def test_cube_mesh_with_gpu0_busy_takes_the_other_nvlink_island(topo_text):
    m = topo.parse(topo_text("topo_dgx1_cube.txt"))
    assert pick(m.links, [1, 2, 3, 4, 5, 6, 7], 4) == [4, 5, 6, 7]
    assert lowest([1, 2, 3, 4, 5, 6, 7], 4) == [1, 2, 3, 4]


def test_cube_mesh_prefers_nv2_pairs(topo_text):
    m = topo.parse(topo_text("topo_dgx1_cube.txt"))
    # 0-1 is NV1, 0-3 is NV2: the wider bond wins even though 1 is the lower index.
    assert pick(m.links, range(8), 2) == [0, 3]


def test_phb_pairs_joined_by_sys_with_gpu0_busy_takes_the_other_pair(topo_text):
    m = topo.parse(topo_text("topo_4gpu_phb_sys.txt"))
    assert pick(m.links, [1, 2, 3], 2) == [2, 3]
    assert lowest([1, 2, 3], 2) == [1, 2]


def test_nvswitch_all_equal_keeps_lowest_indices(topo_text):
    m = topo.parse(topo_text("topo_dgx_h100.txt"))
    assert pick(m.links, [1, 3, 4, 5, 6, 7], 4) == [1, 3, 4, 5]


def test_pcie_server_keeps_pairs_and_sockets_together(topo_text):
    m = topo.parse(topo_text("topo_pcie_2socket.txt"))
    assert pick(m.links, [0, 2, 3, 4, 5], 2) == [2, 3]  # the free PIX pair, not 0+2 (NODE)
    assert pick(m.links, [0, 1, 2, 4, 5, 6], 3) == [0, 1, 2]  # one socket: slowest NODE beats SYS
    assert pick(m.links, [1, 2, 4, 5, 6, 7], 4) == [4, 5, 6, 7]


def test_slowest_link_first_then_total():
    # {0,1,2}: links NV4, NV4, PIX -> slowest PIX. {3,4,5}: NV1 everywhere -> slowest NV1 wins.
    links = {
        0: {1: "NV4", 2: "NV4", 3: "SYS", 4: "SYS", 5: "SYS"},
        1: {2: "PIX", 3: "SYS", 4: "SYS", 5: "SYS"},
        2: {3: "SYS", 4: "SYS", 5: "SYS"},
        3: {4: "NV1", 5: "NV1"},
        4: {5: "NV1"},
    }
    assert pick(links, range(6), 3) == [3, 4, 5]


def test_total_breaks_a_tie_on_the_slowest_link():
    links = {0: {1: "PIX", 2: "PIX", 3: "PIX"}, 1: {2: "PIX", 3: "PIX"}, 2: {3: "NV2"}}
    assert pick(links, range(4), 2) == [2, 3]
    assert pick(links, range(4), 3) == [0, 2, 3]


def test_one_device_or_no_links_keeps_lowest_free():
    links = {0: {1: "SYS"}, 1: {0: "SYS"}, 2: {3: "NV8"}, 3: {2: "NV8"}}
    assert pick(links, [3, 1, 2], 1) == [1]
    assert pick({}, [5, 2, 7], 2) == [2, 5]
    assert pick(links, [2, 3], 0) == []


def test_missing_pair_is_unknown_not_an_error():
    links = {0: {1: "NV2"}, 1: {0: "NV2"}, 2: {}}
    assert pick(links, [0, 1, 2], 2) == [0, 1]
    assert pick(links, [0, 1, 2], 3) == [0, 1, 2]


def test_bad_requests_are_refused_clearly():
    with pytest.raises(ValueError, match="asked for 3 devices but only 2 are free"):
        pick({0: {1: "NV1"}}, [0, 1], 3)
    with pytest.raises(ValueError, match="only 1 are free"):
        pick({}, [0], 2)
    with pytest.raises(ValueError, match="never negative"):
        pick({}, [-1, 0], 1)
    with pytest.raises(ValueError, match="count must be positive"):
        best_set([0, 1], -1, lambda a, b: 0)


@pytest.mark.parametrize("seed", range(40))
def test_exact_against_brute_force(seed):
    rng = random.Random(seed)
    n = rng.randint(2, 10)
    vocabulary = rng.sample(LINKS, rng.randint(1, 4))
    links = random_matrix(rng, n, vocabulary)
    free = sorted(rng.sample(range(n), rng.randint(2, n)))
    count = rng.randint(2, len(free))
    assert pick(links, free, count) == brute_force(links, free, count)


def test_sixteen_devices_exact():
    rng = random.Random(16)
    links = random_matrix(rng, 16, ["NV2", "NV4", "PIX", "NODE", "SYS"])
    free = list(range(16))
    assert pick(links, free, 6) == brute_force(links, free, 6)


# -- the fast search: unchanged answers, every path ---------------------------------------------------------

RANDOM_LINKS = ["NV2", "NV4", "PIX", "NODE", "SYS"]


def bench_layout(seed):
    """One of hack/bench_pick.py's random 16-device layouts."""
    return random_matrix(random.Random(1000 + seed), 16, RANDOM_LINKS)


# Layouts 1, 15, 16, 20 and 27 have no 8 devices pairwise at NODE or better: their slowest link is SYS,
# where every set is allowed and only the total decides; the others settle at NODE.
@pytest.mark.parametrize("seed", [0, 1, 15, 16, 20, 27])
def test_eight_of_sixteen_random_links_is_exact(seed):
    links = bench_layout(seed)
    assert pick(links, range(16), 8) == brute_force(links, range(16), 8)


@pytest.mark.parametrize("seed", range(12))
def test_random_free_sets_and_counts_are_exact(seed):
    rng = random.Random(500 + seed)
    n = rng.randint(9, 16)
    links = random_matrix(rng, n, rng.sample(LINKS, rng.randint(2, 5)))
    free = sorted(rng.sample(range(n), rng.randint(3, n)))
    count = rng.randint(2, min(len(free), 7))
    assert pick(links, free, count) == brute_force(links, free, count)


def test_ties_everywhere_keep_the_lowest_indices():
    links = random_matrix(random.Random(3), 16, ["NV18"])
    assert pick(links, range(16), 8) == list(range(8))
    assert pick(links, [3, 5, 7, 9, 11, 13, 15, 1], 4) == [1, 3, 5, 7]


def test_wide_bonds_and_large_counts_take_wider_lanes():
    # NV999 ranks 1005: with 15 of 16 the lane sums outgrow 16 bits.
    rng = random.Random(7)
    links = random_matrix(rng, 16, ["NV999", "NV18", "SYS"])
    assert pick(links, range(16), 15) == brute_force(links, range(16), 15)
    assert pick(links, range(16), 16) == list(range(16))


def test_more_devices_than_the_lanes_serve_use_the_branch_and_bound():
    rng = random.Random(22)
    links = random_matrix(rng, 22, ["NV4", "PIX", "SYS"])
    assert pick(links, range(22), 3) == brute_force(links, range(22), 3)
    assert pick(links, range(1, 22, 2), 4) == brute_force(links, range(1, 22, 2), 4)


def test_the_rank_matrix_is_computed_once_per_topology():
    links = bench_layout(2)
    rank_matrix.cache_clear()
    pick(links, range(16), 8)
    pick(links, range(1, 16), 4)
    pick({a: dict(row) for a, row in links.items()}, range(16), 2)  # an equal copy is the same topology
    assert rank_matrix.cache_info().misses == 1 and rank_matrix.cache_info().hits == 2


def test_the_pick_command_chooses_the_exact_set(tmp_path, capsys):
    from nodefabric_operator.console import main

    links = bench_layout(16)
    path = tmp_path / "links.json"
    path.write_text(json.dumps({str(a): {str(b): v for b, v in row.items()} for a, row in links.items()}))
    assert main(["pick", "--links", str(path), "--count", "8"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert [int(i) for i in first.split(",")] == brute_force(links, range(16), 8)
    assert main(["pick", "--links", str(path), "--free", "0-5,9-15", "--count", "8", "--json"]) == 0
    free = [*range(6), *range(9, 16)]
    assert json.loads(capsys.readouterr().out)["chosen"] == brute_force(links, free, 8)


# -- past the lanes: a bounded search that says whether it is exact ----------------------------------------


def test_past_twenty_devices_the_bounded_search_matches_the_unbounded_one_where_it_finishes():
    # Sets of a handful from 24 and 32 devices: the branch and bound finishes within the budget, and its
    # answer is the unbounded search's (checked against branch_and_bound, the exact search it bounds).
    for n, count, seed in [(24, 5, 0), (24, 8, 1), (32, 6, 2), (32, 8, 1), (21, 8, 3)]:
        links = random_matrix(random.Random(seed), n, ["NV2", "NV4", "PIX", "NODE", "SYS"])
        found = choose(links, range(n), count)
        r = rank_matrix(topology(links)).among(list(range(n)))
        assert found.exact, (n, count, seed)
        assert found.indices == branch_and_bound(r, count)


def test_small_choices_among_many_devices_weigh_every_set():
    rng = random.Random(23)
    links = random_matrix(rng, 23, ["NV4", "PIX", "SYS"])
    found = choose(links, range(23), 3)
    assert found == Picked(brute_force(links, range(23), 3), True)


def test_sixteen_of_thirty_two_random_devices_answers_and_says_best_found():
    links = random_matrix(random.Random(32), 32, ["NV4", "SYS"])
    found = choose(links, range(32), 16)
    assert not found.exact
    assert len(found.indices) == 16 and found.indices == sorted(set(found.indices))
    assert set(found.indices) <= set(range(32))
    # Steps are counted, not timed: the same request gets the same answer.
    assert choose(links, range(32), 16) == found
    # The greedy walk and swaps beat the lowest indices by the pick's own order.
    rank = matrix_rank(links)
    mine, base = score(found.indices, rank), score(list(range(16)), rank)
    assert (mine.slowest, mine.total) >= (base.slowest, base.total)


def test_clusters_past_twenty_devices_take_whole_clusters():
    # 32 devices in clusters of 8 (NV12 inside, SYS across): 12 is one whole cluster and half another.
    links = {i: {j: "NV12" if i // 8 == j // 8 else "SYS" for j in range(32) if j != i} for i in range(32)}
    assert choose(links, range(32), 12).indices == list(range(12))
    assert choose(links, [*range(3), *range(8, 32)], 8).indices == list(range(8, 16))
    nvswitch = {i: {j: "NV18" for j in range(32) if j != i} for i in range(32)}
    assert choose(nvswitch, range(32), 16) == Picked(list(range(16)), True)


def test_a_spent_budget_still_answers_a_valid_set_and_says_so():
    links = bench_layout(4)
    found = choose(links, range(16), 8, budget=0)
    assert not found.exact and len(found.indices) == 8
    exact = choose(links, range(16), 8)
    assert exact.exact and exact.indices == brute_force(links, range(16), 8)
    big = random_matrix(random.Random(5), 32, ["NV4", "PIX", "SYS"])
    spent = choose(big, range(32), 20, budget=0)
    assert not spent.exact and len(set(spent.indices)) == 20


def test_more_devices_than_a_pick_serves_are_refused():
    links = {i: {j: "NV4" for j in range(MAX_DEVICES + 1) if j != i} for i in range(MAX_DEVICES + 1)}
    with pytest.raises(ValueError, match=f"at most {MAX_DEVICES}"):
        choose(links, range(MAX_DEVICES + 1), 2)
    with pytest.raises(ValueError, match=f"at most {MAX_DEVICES}"):
        choose(links, range(4), 2)  # four free, but the matrix itself is too big to rank
    with pytest.raises(ValueError, match=f"at most {MAX_DEVICES}"):
        pick({}, range(MAX_DEVICES + 1), 2)


def _matrix_file(tmp_path, links):
    path = tmp_path / "links.json"
    path.write_text(json.dumps({str(a): {str(b): v for b, v in row.items()} for a, row in links.items()}))
    return path


def test_the_pick_command_says_exact_or_best_found(tmp_path, capsys):
    from nodefabric_operator.console import main

    path = _matrix_file(tmp_path, random_matrix(random.Random(32), 32, ["NV4", "SYS"]))
    assert main(["pick", "--links", str(path), "--count", "16"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out[0].split(",")) == 16
    assert out[1].endswith("(best found: the search spent its budget before proving no set beats it)")
    assert main(["pick", "--links", str(path), "--count", "16", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["search"] == "best-found"
    assert main(["pick", "--links", str(path), "--count", "3", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["search"] == "exact"
    assert main(["pick", "--links", str(_matrix_file(tmp_path, bench_layout(1))), "--count", "8"]) == 0
    assert capsys.readouterr().out.splitlines()[1].endswith("(exact)")


@pytest.mark.parametrize("shape", ["dict", "rows"])
def test_the_pick_command_refuses_more_devices_than_it_serves_in_one_line(tmp_path, capsys, shape):
    from nodefabric_operator.console import main

    n = MAX_DEVICES + 1
    if shape == "dict":
        path = _matrix_file(tmp_path, {i: {(i + 1) % n: "NV4"} for i in range(n)})
    else:
        path = tmp_path / "rows.json"
        path.write_text(json.dumps([["X" if i == j else "SYS" for j in range(n)] for i in range(n)]))
    assert main(["pick", "--links", str(path), "--count", "2"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"nodefabric pick: the link matrix has {n} devices; pick chooses among at most {MAX_DEVICES} "
        "(the search's time bound holds up to there)\n"
    )
