"""Benchmark: the exact device pick on 8-GPU NVLink layouts against the lowest-free-indices baseline.

Prints microseconds per call for both, measured in the same run, and their ratio. The seed's figures
(greedy from every start GPU, Apple M2 Pro): 44-66 us on an 8-GPU NVLink layout, about 3 us for the
lowest indices.

    .venv/bin/python hack/bench_pick.py
"""

from __future__ import annotations

import random
import timeit
from pathlib import Path

from nodefabric_devicemanager.accelerators import topo
from nodefabric_devicemanager.pick import lowest, pick

DATA = Path(__file__).resolve().parent.parent / "tests" / "accelerators" / "data"


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


def main() -> None:
    cube = topo.parse((DATA / "topo_dgx1_cube.txt").read_text()).links
    nvswitch = topo.parse((DATA / "topo_dgx_h100.txt").read_text()).links
    pcie = topo.parse((DATA / "topo_pcie_2socket.txt").read_text()).links
    print("seed (greedy, M2 Pro): 44-66 us on an 8-GPU NVLink layout, ~3 us for the lowest indices")
    case("8-GPU cube mesh, GPU0 busy, 4 of 7", cube, range(1, 8), 4)
    case("8-GPU cube mesh, all free, 2 of 8", cube, range(8), 2)
    case("8-GPU NVSwitch (NV18), GPU0 busy, 4 of 7", nvswitch, range(1, 8), 4)
    case("8-GPU two-socket PCIe, 3 busy, 2 of 5", pcie, [0, 2, 3, 4, 5], 2)
    rng = random.Random(16)
    big = {i: {} for i in range(16)}
    for i in range(16):
        for j in range(i + 1, 16):
            big[i][j] = big[j][i] = rng.choice(["NV2", "NV4", "PIX", "NODE", "SYS"])
    case("16 devices, random links, 8 of 16", big, range(16), 8, number=20)


if __name__ == "__main__":
    main()
