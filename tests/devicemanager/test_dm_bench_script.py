"""The benchmark script runs and compares like with like (its figures are printed, never asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_benchmark_reads_the_same_endpoints_as_its_baseline():
    out = subprocess.run(
        [sys.executable, str(REPO / "hack/bench_inventory.py"), "--pfs", "2", "--vfs", "3", "--rounds", "1"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "tree: 2 PFs x 3 VFs with RDMA devices, 8 endpoints"
    assert [line.split(":")[0] for line in lines[1:]] == [
        "baseline (scandir/open)",
        "inventory pass",
        "ratio",
        "attribute, bare os.open",
        "attribute, safe read",
        "safety cost per read",
    ]


def test_walk_benchmark_replays_the_walks_own_calls_and_prints_each_figure() -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "hack/bench_walk.py"), "--pfs", "2", "--vfs", "3", "--rounds", "1"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    # Exit 1 is the target missed, which a two-function tree says nothing about; anything else failed.
    assert out.returncode in (0, 1), out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("2 PF x   3 VF (")
    assert [line.split(":")[0].strip() for line in lines[1:]] == [
        "in process",
        "own calls",
        "whole command",
        "start-up alone",
        "target",
    ]
    start_up = lines[4].split(":", 1)[1]
    for name in ("python", "pydantic", "models"):
        assert f" {name} " in start_up, start_up
