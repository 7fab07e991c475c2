"""The embedded-API benchmark runs both emulators through the same phases (figures printed, not asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_benchmark_compares_the_same_phases_with_kmock():
    out = subprocess.run(
        [sys.executable, str(REPO / "hack/bench_kubeapi.py"), "--records", "30", "--baseline-records", "20"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("embedded API: Nodes + Devices records")
    assert lines[1].split() == ["phase", "kmock@5", "kmock@20", "ours@20", "ratio", "ours@30"]
    phases = [line[:28].strip() for line in lines[2:9]]
    assert phases == [
        "create Node (POST)",
        "create Devices (POST)",
        "get record (GET)",
        "status patch (PATCH)",
        "list every record",
        "list nodes -l, 1% match",
        "watch, per event delivered",
    ]
    assert all(line.split()[-2].endswith("x") for line in lines[2:9]), "each phase has its ratio"
    bad = subprocess.run(
        [sys.executable, str(REPO / "hack/bench_kubeapi.py"), "--records", "8", "--baseline-records", "9"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
