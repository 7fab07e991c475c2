"""The benchmark script runs and compares like with like (its figures are printed, never asserted)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from nodefabric_devicemanager.testing.scenarios import bench

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


def _bench_walk() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_walk", REPO / "hack/bench_walk.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_walk_benchmark_floor_names_every_file_by_its_whole_path(tmp_path: Path) -> None:
    """The walk opens attributes relative to a directory descriptor; the floor must still open each one by
    its whole path (a bare name would open nothing and make the floor look cheap), and the replay of
    the walk's own calls must open them relative to the same directory."""
    bw = _bench_walk()
    root = tmp_path / "root"
    bench(root, pfs=1, vfs=2)
    ops = bw.record(str(root))
    assert ops["files"] and all(os.path.isabs(f) and os.path.isfile(f) for f in ops["files"]), ops["files"]
    vendor = [f for f in ops["files"] if f.endswith("/vendor")]
    assert len(vendor) == 4  # the bridge, the PF and its two VFs: every function's, by whole path
    # A PF has no `physfn`: its readlink fails in the walk and the floor alike.
    assert all(os.path.islink(link) or not os.path.lexists(link) for link in ops["links"])
    assert sum(link.endswith("/physfn") and os.path.islink(link) for link in ops["links"]) == 2
    calls = bw.record_calls(str(root))
    relative = [c for c in calls if c[0] == "open" and c[4] is not None]
    assert relative and not any(os.path.isabs(c[1]) for c in relative)
    bw.replay_calls(bw.compile_calls(calls))  # descriptors and relative opens replay as recorded
    bw.replay(ops)
