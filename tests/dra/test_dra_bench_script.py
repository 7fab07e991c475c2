"""The DRA benchmark runs end to end and prints each figure beside its floor (figures are never asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_benchmark_prints_each_figure_with_its_floor(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(REPO / "hack/bench_dra.py"),
            "--claims",
            "3",
            "--pfs",
            "2",
            "--vfs",
            "3",
            "--held",
            "40",
            "--rounds",
            "2",
            "--profile",
            str(tmp_path / "profile"),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(
        "pool: 2 PFs x 3 VFs: 6 devices in 1 slices; the checkpoint on disk, CDI specs on "
    )
    assert [line.split(" p50")[0].strip() for line in lines[1:5]] == [
        "prepare, first (API + spec + entry)",
        "prepare, first",
        "prepare, again (checkpoint)",
        "unprepare (spec + fsync)",
    ]
    assert "claim GET p50" in lines[1] and "empty call p50" in lines[2]
    assert lines[5].startswith("target: the first prepare adds <= 20 ms to the claim GET")
    assert lines[6].startswith("prepare, first, before") and "claim GET p50" in lines[6]
    assert lines[7].startswith("unprepare, before") and "empty call p50" in lines[7]
    assert lines[8].startswith("prepare, first against a claim GET + an empty call (")
    assert "(before x" in lines[8]
    assert lines[9].startswith("against the claim GET alone: prepare, first x") and "floor" in lines[9]
    assert lines[10].startswith("prepare, first without its two files (a ceiling, not a driver) x")
    assert "the files cost" in lines[10] and "the rest above the floor" in lines[10]
    assert " p90 " in lines[1] and " p99 " in lines[1]
    assert lines[11].startswith("prepare, first with its hops on the loop's default executor (before) x")
    assert "the driver's own hop threads save" in lines[11]
    assert lines[12].startswith("prepare, first again, side by side: its spec from its device's template x")
    assert "built and encoded for each claim (before) x" in lines[12] and "the templates save" in lines[12]
    assert lines[13].startswith("target x2.0 the claim GET (p50, median of 2 rounds): prepare, first x")
    assert ("): met; its floor x" in lines[13]) != ("): not met; its floor x" in lines[13]), lines[13]
    assert "; with its hops on the default executor (before) x" in lines[13]
    assert "; side by side, its spec from its device's template x" in lines[13]
    del lines[6:14]
    assert lines[6].startswith("steady state, 10 syncs: 0 requests, 0 bytes; a LIST ")
    assert lines[7].startswith("per node-hour, LIST every 60 s (before):   60.0 requests")
    assert lines[8].startswith("per node-hour, watch (after):               8.0 requests")
    assert "fewer requests" in lines[8] and lines[9].startswith("5,000 nodes: 83.3 LIST/s")
    assert lines[10].startswith("prepare+unprepare, 40 held, per-claim p50") and "10 held p50" in lines[10]
    assert lines[11].startswith("prepare+unprepare, 40 held, whole-file p50")
    assert lines[12].startswith("at 40 held the whole-file checkpoint costs x")
    # --profile: the phases of a first prepare beside its floors, then each thread's cProfile, last.
    phases = [line.split(": ", 1)[1].rsplit(" ", 2)[0] for line in lines[13:19]]
    assert phases == [
        "a GET (floor)",
        "an empty call (floor)",
        "kubelet's call to the hop",
        "the GET in the hop",
        "the hop after the GET",
        "the hop's end to kubelet's answer",
    ]
    for line, name in zip(lines[19:21], ("loop", "hop"), strict=True):
        assert line.startswith(
            f"profile, first prepare, {name} thread ({tmp_path}/profile/{name}.prof): busy "
        )
        assert "its costliest own steps: " in line and (tmp_path / "profile" / f"{name}.prof").stat().st_size
    assert len(lines) == 21
