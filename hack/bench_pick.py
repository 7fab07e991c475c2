"""Benchmark: the exact device pick, against baselines measured in the same run.

    .venv/bin/python hack/bench_pick.py [--layouts 30]

Figures:
- 8 of 16 devices with random links (NV2, NV4, PIX, NODE, SYS), over seeded layouts: the worst and the
  median per-call time of `pick` (each layout's best of 7 runs, the rank matrix cached per topology, as
  repeated picks on one machine have it), its first call on a new topology, and the branch and bound it
  replaced, timed on the same layouts in this run. Target: worst <= 1 ms. Answers are compared too.
- 8-GPU layouts from real `nvidia-smi topo -m` captures: pick against the lowest free indices.
- Layouts from 8 to 32 devices (NVSwitch, hybrid cube-mesh, clusters of 8 and 4, random two-speed and
  five-speed links) at counts from 2 to n-1, the rank matrix computed cold each time: the worst and
  median CPU time of one `choose`, how many answers are exact and how many best-found (the step budget
  spent first), and a greedy walk from one start timed alongside. Target: every request <= 50 ms.
- Reading `nvidia-smi topo -m` text of 8 GPUs beside 1,024 VF NICs (a million link cells, what a node
  whose VFs are RDMA devices prints): `topo.parse`, against judging every cell on its own (how the parser
  read them before), in the same run, CPU time, best of 3.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import timeit
from pathlib import Path

from nodefabric_devicemanager import pick as picking
from nodefabric_devicemanager.accelerators import topo
from nodefabric_devicemanager.pick import lowest, pick

DATA = Path(__file__).resolve().parent.parent / "tests" / "accelerators" / "data"
RANDOM_LINKS = ["NV2", "NV4", "PIX", "NODE", "SYS"]
TARGET_MS = 1.0
BOUND_MS = 50.0
CUBE = [
    (0, 1, "NV1"), (0, 2, "NV1"), (0, 3, "NV2"), (0, 4, "NV2"), (1, 2, "NV2"), (1, 3, "NV1"), (1, 5, "NV2"),
    (2, 3, "NV2"), (2, 6, "NV1"), (3, 7, "NV1"), (4, 5, "NV1"), (4, 6, "NV1"), (4, 7, "NV2"), (5, 6, "NV2"),
    (5, 7, "NV1"), (6, 7, "NV2"),
]  # fmt: skip


def random_layout(seed: int, n: int = 16) -> dict[int, dict[int, str]]:
    """The same layouts as tests/accelerators/test_accel_pick.py's bench_layout."""
    rng = random.Random(1000 + seed)
    m: dict[int, dict[int, str]] = {i: {} for i in range(n)}
    for i in range(n):
        for j in range(i + 1, n):
            m[i][j] = m[j][i] = rng.choice(RANDOM_LINKS)
    return m


def best_of(fn, repeat: int = 7) -> float:
    """Seconds of the fastest of `repeat` calls: the machine's noise only ever adds time."""
    out = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - start)
    return out


def random_layouts(count: int) -> bool:
    layouts = [random_layout(seed) for seed in range(count)]
    warm, cold, before = [], [], []
    for links in layouts:
        picking.rank_matrix.cache_clear()
        picking._lanes.cache_clear()
        start = time.perf_counter()
        chosen = pick(links, range(16), 8)
        cold.append(time.perf_counter() - start)
        warm.append(best_of(lambda links=links: pick(links, range(16), 8)))
        rank = picking.matrix_rank(links)
        r = [[rank(i, j) if i != j else 0 for j in range(16)] for i in range(16)]
        before.append(best_of(lambda r=r: picking.branch_and_bound(r, 8), repeat=3))
        assert [list(range(16))[i] for i in picking.branch_and_bound(r, 8)] == chosen, "answers differ"

    def ms(samples: list[float], q: float) -> float:
        return sorted(samples)[min(len(samples) - 1, int(q * len(samples)))] * 1e3

    print(f"8 of 16 devices, random links, {count} layouts (same answers from both searches):")
    print(f"  pick               worst {max(warm) * 1e3:7.3f} ms  median {ms(warm, 0.5):7.3f} ms")
    print(
        f"  pick, first call   worst {max(cold) * 1e3:7.3f} ms  median {ms(cold, 0.5):7.3f} ms  (cold caches)"
    )
    print(
        f"  branch and bound   worst {max(before) * 1e3:7.3f} ms  median {ms(before, 0.5):7.3f} ms  "
        f"(baseline, this run)  worst x{max(before) / max(warm):.1f}"
    )
    ok = max(warm) * 1e3 <= TARGET_MS
    print(f"  target: worst <= {TARGET_MS:g} ms: {'met' if ok else 'MISSED'}")
    return ok


def per_call_us(fn, number: int) -> float:
    best = min(timeit.repeat(fn, number=number, repeat=5))
    return best / number * 1e6


def case(name: str, links, free, count, number: int = 2000) -> None:
    chosen = pick(links, free, count)
    ours = per_call_us(lambda: pick(links, free, count), number)
    base = per_call_us(lambda: lowest(free, count), number * 10)
    print(
        f"{name:<44} pick {ours:8.1f} us  lowest {base:6.2f} us  ratio {ours / base:6.1f}x  "
        f"chosen {','.join(map(str, chosen))}  (lowest {','.join(map(str, lowest(free, count)))})"
    )


def matrix(n: int, link) -> dict[int, dict[int, str]]:
    return {i: {j: link(i, j) for j in range(n) if j != i} for i in range(n)}


def cube_mesh(n: int) -> dict[int, dict[int, str]]:
    """DGX-1 hybrid cube-meshes of 8, NODE within a socket's four, SYS beyond."""
    m = matrix(n, lambda i, j: "NODE" if i // 4 == j // 4 else "SYS")
    for base in range(0, n, 8):
        for a, b, link in CUBE:
            if base + b < n:
                m[base + a][base + b] = m[base + b][base + a] = link
    return m


def layouts(n: int, seed: int):
    yield "NVSwitch", matrix(n, lambda i, j: "NV18")
    yield "cube mesh", cube_mesh(n)
    yield "clusters of 8", matrix(n, lambda i, j: "NV12" if i // 8 == j // 8 else "SYS")
    yield "clusters of 4", matrix(n, lambda i, j: "NV12" if i // 4 == j // 4 else "SYS")
    for name, vocabulary in (("random two-speed", ["NV4", "SYS"]), ("random five-speed", RANDOM_LINKS)):
        rng = random.Random(seed * 1000 + n)
        m: dict[int, dict[int, str]] = {i: {} for i in range(n)}
        for i in range(n):
            for j in range(i + 1, n):
                m[i][j] = m[j][i] = rng.choice(vocabulary)
        yield name, m


def any_size(seeds: int) -> bool:
    """Every request within BOUND_MS, exact where the search is cheap, the best found otherwise."""
    print(f"any device count up to {picking.MAX_DEVICES}, cold rank matrix, {seeds} random seed(s):")
    head = ("devices", "requests", "exact", "best-found", "worst ms", "median ms", "one greedy walk ms")
    print("  (CPU time per request; a greedy walk from one start timed alongside, wall)")
    print("  " + "  ".join(f"{h:>{w}}" for h, w in zip(head, (7, 8, 5, 10, 8, 9, 18), strict=True)))
    worst_all = 0.0
    for n in (8, 12, 16, 20, 24, 28, 32):
        times, greedy, exact, total = [], [], 0, 0
        for count in sorted({2, n // 4, n // 2, 3 * n // 4, n - 1}):
            for seed in range(seeds):
                for _, links in layouts(n, seed):
                    picking.rank_matrix.cache_clear()
                    # CPU time: on a machine shared with other work, wall time adds their turns.
                    start = time.process_time()
                    found = picking.choose(links, range(n), count)
                    times.append(time.process_time() - start)
                    r = picking.rank_matrix(picking.topology(links)).rows
                    start = time.perf_counter()
                    picking._greedy(r, count, picking._Steps(0))
                    greedy.append(time.perf_counter() - start)
                    exact += found.exact
                    total += 1
        times.sort()
        greedy.sort()
        worst_all = max(worst_all, times[-1])
        print(
            f"  {n:>7}  {total:>8}  {exact:>5}  {total - exact:>10}  {times[-1] * 1e3:8.2f}  "
            f"{times[len(times) // 2] * 1e3:9.2f}  {greedy[len(greedy) // 2] * 1e3:18.2f}"
        )
    ok = worst_all * 1e3 <= BOUND_MS
    print(
        f"  target: every request <= {BOUND_MS:g} ms: {'met' if ok else 'MISSED'} "
        f"(worst {worst_all * 1e3:.1f} ms)"
    )
    return ok


def vf_nic_text(gpus: int = 8, nics: int = 1024) -> str:
    names = [f"GPU{i}" for i in range(gpus)] + [f"NIC{i}" for i in range(nics)]
    lines = ["\t" + "\t".join(names) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"]
    for r, row in enumerate(names):
        cells = ["X" if c == r else "NV18" if max(r, c) < gpus else "SYS" for c in range(len(names))]
        lines.append(row + "\t" + "\t".join(cells) + ("\t0-47\t0\t\tN/A" if r < gpus else ""))
    return "\n".join(lines) + "\n"


def read_vf_nics() -> None:
    text = vf_nic_text()
    lines = text.splitlines()
    columns = lines[0].split("\t")[1:-3]
    rows = [(n, line.split("\t")) for n, line in enumerate(lines[1:], start=2)]

    def every_cell() -> None:
        # What parse did per cell before: the cell judged, its place spelled for a refusal.
        for line_no, cells in rows:
            name = cells[0]
            [
                topo._cell(c, f"line {line_no}, {name}/{columns[k]}")
                for k, c in enumerate(cells[1 : 1 + len(columns)])
            ]

    parsed = min(timeit.repeat(lambda: topo.parse(text), number=1, repeat=3, timer=time.process_time))
    each = min(timeit.repeat(every_cell, number=1, repeat=3, timer=time.process_time))
    cells = len(rows) * len(columns)
    print(f"topo -m of 8 GPUs and 1,024 VF NICs ({len(text) / 1e6:.1f} MB, {cells:,} cells):")
    print(f"  topo.parse {parsed * 1e3:7.1f} ms, the whole read")
    print(f"  each cell judged on its own (the per-cell work of the parse before) {each * 1e3:7.1f} ms")
    print(f"  the whole read x{parsed / each:.2f} the per-cell work it replaced")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layouts", type=int, default=30)
    parser.add_argument("--seeds", type=int, default=3, help="random layouts per size and count")
    args = parser.parse_args()
    ok = random_layouts(args.layouts)
    ok = any_size(args.seeds) and ok
    cube = topo.parse((DATA / "topo_dgx1_cube.txt").read_text()).links
    nvswitch = topo.parse((DATA / "topo_dgx_h100.txt").read_text()).links
    pcie = topo.parse((DATA / "topo_pcie_2socket.txt").read_text()).links
    print("seed (greedy, M2 Pro): 44-66 us on an 8-GPU NVLink layout, ~3 us for the lowest indices")
    case("8-GPU cube mesh, GPU0 busy, 4 of 7", cube, range(1, 8), 4)
    case("8-GPU cube mesh, all free, 2 of 8", cube, range(8), 2)
    case("8-GPU NVSwitch (NV18), GPU0 busy, 4 of 7", nvswitch, range(1, 8), 4)
    case("8-GPU two-socket PCIe, 3 busy, 2 of 5", pcie, [0, 2, 3, 4, 5], 2)
    read_vf_nics()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
