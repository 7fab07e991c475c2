"""Benchmark: the full host walk (`nodefabric inventory`'s pass) against a floor over exactly the files it
opens, in the same run, interleaved.

    .venv/bin/python hack/bench_walk.py [--pfs 8] [--vfs 16,128,512] [--rounds 7] [--profile]

The floor is recorded, not written by hand: one pass runs with os.listdir, os.scandir, os.open and
os.readlink watched, and the floor replays exactly what it saw: an os.scandir of each directory it listed
(by path, also when the pass listed it through a descriptor), an os.open/os.read/os.close of each
attribute it read (by its whole path, also when the pass opened it relative to a directory descriptor;
an open that failed, or that opened a directory to list it, read nothing), an os.readlink of each link
it named (by its whole path too) (resolution is left out: O_PATH, /proc/self/fd and the `device` links
the walk checks by their text; it is the safety the floor does not pay for). Figures:
- in process: inventory.read() against the replay, medians over interleaved rounds;
- the walk's own calls: every os call one pass makes (the safety ones too: O_PATH opens, /proc/self/fd
  readlinks, the reads that hear EOF, lstats, listings through a descriptor, opens that fail), recorded
  in order and replayed as straight-line Python (no dispatch). Its ratio to the floor is what the calls
  beyond the floor's cost; the walk's ratio to it is what Python (verdicts, parsing, models) costs;
- whole command: `nodefabric inventory --root R -o json` as a process against a Python process that
  replays the same list (both pay the interpreter's start-up; .pyc files written, as an install has);
  beside it, what start-up alone costs as a process: the bare interpreter, pydantic's import, and the
  record's models (`nodefabric_devicemanager.models`), each against the floor's whole process.
All figures are CPU time (user and system), not wall time: the machine is shared.
Target: each <= 1.5x its floor.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import inspect
import json
import os
import pstats
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from nodefabric_devicemanager import inventory
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.testing.scenarios import bench

TARGET = 1.5
# What the command's start-up costs before it reads anything, each as a process of its own: the bare
# interpreter (the floor pays it too), pydantic's import alone, and the record's models built.
START_UP = {
    "python": "pass",
    "pydantic": "from pydantic import BaseModel, ConfigDict, Field",
    "models": "import nodefabric_devicemanager.models",
}


def record(root: str) -> dict[str, list[str]]:
    """What one pass lists, opens to read, and reads links of."""
    ops: dict[str, list[str]] = {"dirs": [], "files": [], "links": []}
    real = os.listdir, os.open, os.readlink, os.scandir

    def listdir(path: str = ".") -> list[str]:
        ops["dirs"].append(os.fspath(path))
        return real[0](path)

    def scandir(path: str | int = ".") -> object:
        # A directory listed through a descriptor the walk opened is replayed by its path.
        ops["dirs"].append(real[2](f"/proc/self/fd/{path}") if isinstance(path, int) else os.fspath(path))
        return real[3](path)

    def spell(path: str, kw: dict[str, object]) -> str:
        # A name opened relative to a directory descriptor is replayed by its whole path, as the floor
        # names every file.
        at = kw.get("dir_fd")
        return os.fspath(path) if at is None else f"{real[2](f'/proc/self/fd/{at}')}/{os.fspath(path)}"

    def open_(path: str, flags: int, *args: object, **kw: object) -> int:
        fd = real[1](path, flags, *args, **kw)  # type: ignore[arg-type]
        # O_PATH: resolution, not a read; O_DIRECTORY: a directory opened to be listed, which the floor
        # pays as the listing itself. An open that failed read nothing (an absent attribute is learned
        # from the open itself), so the floor does not pay for it either.
        if not flags & (getattr(os, "O_PATH", 0) | os.O_DIRECTORY):
            ops["files"].append(spell(path, kw))
        return fd

    def readlink(path: str, *args: object, **kw: object) -> str:
        # Resolution, not a read: /proc/self/fd/N (where the kernel landed), and an interface's `device`
        # link, whose text the walk checks against a function directory it already resolved instead of
        # asking the kernel again; the floor leaves both out, as it leaves out O_PATH.
        spelled = spell(path, kw)
        if not spelled.startswith("/proc/self/fd/") and not spelled.endswith("/device"):
            ops["links"].append(spelled)
        return real[2](path, *args, **kw)  # type: ignore[arg-type]

    os.listdir, os.open, os.readlink, os.scandir = listdir, open_, readlink, scandir  # type: ignore[assignment]
    try:
        inventory.read(HostRoot.at(root))
    finally:
        os.listdir, os.open, os.readlink, os.scandir = real
    return ops


Call = tuple[str, object, int, bool, "int | None"]
RECORDED = ("open", "read", "close", "scandir", "readlink", "lstat", "stat", "fstat")


def record_calls(root: str) -> list[Call]:
    """Every os call one pass makes, in order: (name, path or descriptor, flags or size, whether it
    succeeded, the directory descriptor a name was taken relative to or None). For an open that
    succeeded, an ("opened", descriptor, 0, True, None) follows."""
    calls: list[Call] = []
    real = {name: getattr(os, name) for name in RECORDED}

    def watch(name: str) -> Callable[..., object]:
        fn = real[name]

        def watched(*args: object, **kw: object) -> object:
            arg = args[0] if args else "."
            spelled = arg if isinstance(arg, int) else os.fspath(arg)  # type: ignore[arg-type]
            extra = args[1] if name in ("open", "read") else 0
            at = kw.get("dir_fd")
            try:
                result = fn(*args, **kw)
            except OSError:
                calls.append((name, spelled, extra, False, at))  # type: ignore[arg-type]
                raise
            calls.append((name, spelled, extra, True, at))  # type: ignore[arg-type]
            if name == "open":  # the descriptor it gave, for the calls that use it
                calls.append(("opened", result, 0, True, None))
            return result

        return watched

    for name in RECORDED:
        setattr(os, name, watch(name))
    try:
        inventory.read(HostRoot.at(root))
    finally:
        for name, fn in real.items():
            setattr(os, name, fn)
    return calls


def compile_calls(calls: list[Call]) -> list[Callable[[], None]]:
    """The recorded calls as straight-line Python, in functions of a few thousand calls each: no
    dispatch, no lookup per call beyond the floor's own, so the replay costs what the calls cost. A
    descriptor is the variable `fd<recorded number>`; a call that failed when recorded is wrapped in
    try/except (free in Python 3.11 until it raises)."""

    def line(call: Call, nxt: Call | None) -> list[str]:
        name, arg, extra, ok, at = call
        ref = f"fd{arg}" if isinstance(arg, int) else repr(arg)
        if isinstance(arg, str) and arg.startswith("/proc/self/fd/"):
            ref = f"'/proc/self/fd/%d' % fd{arg[14:]}"
        # Relative to a directory descriptor, as the walk called it.
        relative = "" if at is None else f", dir_fd=fd{at}"
        if name == "open":
            assign = f"fd{nxt[1]} = " if ok and nxt is not None and nxt[0] == "opened" else ""
            code = [f"{assign}_open({ref}, {extra}{relative})"]
        elif name == "read":
            code = [f"_read({ref}, {extra})"]
        elif name == "scandir":
            code = [
                f"with _scandir({ref}) as it:",
                "    for e in it:",
                "        e.is_dir(follow_symlinks=False)",
            ]
        elif name == "opened":
            return []
        else:
            code = [f"_{name}({ref}{relative})"]
        if ok:
            return code
        return ["try:", *("    " + c for c in code), "except OSError:", "    pass"]

    statements = [line(call, calls[n + 1] if n + 1 < len(calls) else None) for n, call in enumerate(calls)]
    # One namespace for every chunk: a descriptor opened in one is closed in the next.
    scope: dict[str, object] = {f"_{name}": getattr(os, name) for name in RECORDED}
    fns: list[Callable[[], None]] = []
    size = 2000
    for start in range(0, len(statements), size):
        chunk = [c for statement in statements[start : start + size] for c in statement]
        used = {w for c in chunk for w in re.findall(r"\bfd\d+\b", c)}
        glob = "    global " + ", ".join(sorted(used)) + "\n" if used else ""
        src = "def run():\n" + glob + "".join(f"    {c}\n" for c in chunk) + "    pass\n"
        exec(compile(src, "<calls>", "exec"), scope)
        fns.append(scope["run"])  # type: ignore[arg-type]
    return fns


def replay_calls(fns: list[Callable[[], None]]) -> None:
    for fn in fns:
        fn()


def replay(ops: dict[str, list[str]]) -> None:
    for d in ops["dirs"]:
        with os.scandir(d) as it:
            for _ in it:
                pass
    for f in ops["files"]:
        fd = os.open(f, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.read(fd, 65537)
        finally:
            os.close(fd)
    for link in ops["links"]:
        with contextlib.suppress(OSError):  # an absent link fails in the walk too
            os.readlink(link)


def floor_script() -> str:
    """The floor as a bare process: `replay` itself, with no import of ours (the command's own start-up
    is what it is measured against)."""
    run = "replay(json.load(open(sys.argv[1])))"
    return f"import contextlib, json, os, sys\n\n{inspect.getsource(replay)}\n{run}\n"


def walk(root: str) -> None:
    inventory.read(HostRoot.at(root))


def seconds(fn, *args: object) -> float:
    """CPU seconds (user and system) of this process: on a machine shared with other work, wall time
    would add their turns."""
    start = time.process_time()
    fn(*args)
    return time.process_time() - start


def child_seconds(cmd: list[str], env: dict[str, str]) -> float:
    """CPU seconds (user and system) of one command run to its end."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def one_tree(pfs: int, vfs: int, rounds: int, profile: bool) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        root = str(Path(tmp) / "root")
        bench(Path(root), pfs=pfs, vfs=vfs)
        walk(root)  # warm the page and dentry caches
        ops = record(root)
        plan = Path(tmp) / "ops.json"
        plan.write_text(json.dumps(ops))
        if profile:
            prof = cProfile.Profile()
            prof.runcall(walk, root)
            pstats.Stats(prof).sort_stats("tottime").print_stats(20)
        own_calls = record_calls(root)
        own = compile_calls(own_calls)
        walks, floors, owns = [], [], []
        for _ in range(rounds):
            floors.append(seconds(replay, ops))
            owns.append(seconds(replay_calls, own))
            walks.append(seconds(walk, root))
        cli = "nodefabric_operator.console"
        cmd = [sys.executable, "-m", cli, "inventory", "--root", root, "-o", "json"]
        floor_cmd = [sys.executable, "-c", floor_script(), str(plan)]
        # As installed, modules are compiled once (pip writes the .pyc files): let both write theirs.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        child_seconds(cmd, env), child_seconds(floor_cmd, env)
        procs, floor_procs = [], []
        starts: dict[str, list[float]] = {name: [] for name in START_UP}
        for _ in range(rounds):
            floor_procs.append(child_seconds(floor_cmd, env))
            procs.append(child_seconds(cmd, env))
            for name, code in START_UP.items():
                starts[name].append(child_seconds([sys.executable, "-c", code], env))
    w, f = statistics.median(walks), statistics.median(floors)
    c = statistics.median(owns)
    p, fp = statistics.median(procs), statistics.median(floor_procs)
    counts = f"{len(ops['dirs'])} dirs, {len(ops['files'])} files, {len(ops['links'])} links"
    print(f"{pfs} PF x {vfs:>3} VF ({counts}):")
    print(f"  in process:    walk {w * 1e3:7.1f} ms  floor {f * 1e3:7.1f} ms  ratio {w / f:5.2f}x")
    print(
        f"  own calls:     calls {c * 1e3:6.1f} ms  floor {f * 1e3:7.1f} ms  ratio {c / f:5.2f}x"
        f"  (walk / own calls {w / c:4.2f}x: Python; {len(own_calls)} calls)"
    )
    print(f"  whole command: walk {p * 1e3:7.1f} ms  floor {fp * 1e3:7.1f} ms  ratio {p / fp:5.2f}x")
    start = {name: statistics.median(times) for name, times in starts.items()}
    print(
        "  start-up alone: "
        + "  ".join(f"{name} {t * 1e3:5.1f} ms ({t / fp:4.2f}x the floor)" for name, t in start.items())
    )
    return w <= TARGET * f and p <= TARGET * fp


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--pfs", type=int, default=8)
    ap.add_argument("--vfs", default="16,128,512")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    ok = True
    for vfs in (int(v) for v in args.vfs.split(",")):
        ok &= one_tree(args.pfs, vfs, args.rounds, args.profile)
    print(f"target: each <= {TARGET}x its floor: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
