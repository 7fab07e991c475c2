"""The whole walk (`nodefabric inventory`) over a real tree, in a process short of descriptors and in one
that may not read what it walks: every descriptor-holding step (the `infiniband` listing, the RDMA device
held relative to it, its `ports` listing, a port, an attribute) fails as itself, never as "absent", and
nothing is left open."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from walk_documents import document

from nodefabric_devicemanager.testing.scenarios import bench

# Run in a child process: the walk with RLIMIT_NOFILE at each of a range of limits just above what the
# process holds, its document and the descriptors it left open (the count before against after).
_SCARCE = r"""
import contextlib, io, json, os, resource, sys
sys.path.insert(0, sys.argv[2])
from walk_documents import document
from pathlib import Path
root = Path(sys.argv[1])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
document(root)  # everything the walk imports, imported while descriptors are to be had
out = []
for extra in range(0, 10):
    before = len(os.listdir("/proc/self/fd")) - 1
    resource.setrlimit(resource.RLIMIT_NOFILE, (before + extra, hard))
    try:
        text = document(root)
    except BaseException as exc:  # noqa: BLE001 - reported to the test, which fails on it
        text = f"raised {type(exc).__name__}: {exc}"
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    out.append({"extra": extra, "text": text, "leaked": len(os.listdir("/proc/self/fd")) - 1 - before})
print(json.dumps(out))
"""


def _rdma_verdicts(text: str) -> list[dict[str, str]]:
    """Every `link` verdict of the document (exit code line dropped), in order."""
    found: list[dict[str, str]] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "link" and isinstance(value, dict):
                    found.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(text.partition("\n")[2]))
    return found


def test_a_walk_short_of_descriptors_says_so_and_leaves_none_open(tmp_path: Path) -> None:
    root = tmp_path / "root"
    bench(root, pfs=1, vfs=3)
    full = document(root)
    assert full.startswith("exit 0\n")
    ran = subprocess.run(
        [sys.executable, "-c", _SCARCE, str(root), str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    runs = json.loads(ran.stdout)
    short = 0
    for run in runs:
        assert run["leaked"] == 0, run["extra"]
        text = run["text"]
        assert not text.startswith("raised"), text
        if text == full:
            continue
        short += 1
        # What differs names the shortage: a walk that failed (exit 1) says so, or a verdict does; never a
        # value gone missing, never "absent".
        if text.startswith("exit 1\n"):
            failed = [
                c
                for c in json.loads(text.partition("\n")[2])["status"]["conditions"]
                if c["status"] == "False"
            ]
            assert failed and all("Too many open files" in c["message"] for c in failed), failed
            continue
        assert text.startswith("exit 0\n"), text[:400]
        want, got = _rdma_verdicts(full), _rdma_verdicts(text)
        assert len(want) == len(got)
        for w, g in zip(want, got, strict=True):
            if w != g:
                assert g["state"] == "unverified" and "Too many open files" in g["reason"], g
    assert short, "no limit was short enough to bite: the test proves nothing"
    assert runs[-1]["text"] == full


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another user")
def test_unreadable_as_another_user_is_an_error_never_absent() -> None:
    """As a user who may not read them: a VF's `local_cpulist` (absent on every benchmark VF, so None
    from the failed open would be the tempting answer) stops the walk with its path named; a port's
    state is an unverified verdict naming it; nothing is published as absent."""
    # Not under pytest's tmp_path: its parents are private to root, and the other user must reach the tree.
    top = Path(tempfile.mkdtemp(prefix="nf-unreadable-", dir="/tmp"))
    try:
        _unreadable(top)
    finally:
        shutil.rmtree(top)


def _unreadable(top: Path) -> None:
    root = top / "root"
    bench(root, pfs=1, vfs=2)
    for d, _, _ in os.walk(top):
        os.chmod(d, 0o755)
    pf = next(root.glob("sys/devices/*/*/*/infiniband")).parent
    vf = sorted(p for p in pf.parent.iterdir() if (p / "physfn").is_symlink())[0]
    state = next(pf.glob("infiniband/*/ports/1/state"))
    document(root)  # everything the walk imports, imported while it still can be

    def as_nobody() -> str:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                os.close(r)
                os.setgid(65534)
                os.setuid(65534)
                os.write(w, document(root).encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            text = f.read().decode()
        os.waitpid(pid, 0)
        return text

    state.chmod(0)
    text = as_nobody()
    assert text.startswith("exit 0\n"), text[:300]
    verdicts = _rdma_verdicts(text)
    port = [v for v in verdicts if "Permission denied" in v["reason"]]
    assert len(port) == 1 and port[0]["state"] == "unverified" and str(state.name) in port[0]["reason"]
    state.chmod(0o644)

    (vf / "local_cpulist").write_text("0-3\n")
    (vf / "local_cpulist").chmod(0)
    text = as_nobody()
    assert text.startswith("exit 1\n") and "local_cpulist: Permission denied" in text, text[:300]
