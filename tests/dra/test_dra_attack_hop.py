"""Hostile tests of the one-hop prepare: the driver killed (kill -9) at every system call of a prepare
and of an unprepare, then restarted on what the disk holds; the process's one sync thread failing to
start. A kill is simulated at the edge: every `os` call the DRA files make under the test's directories
counts, the Nth raises, and every later one raises too (a dead process touches nothing more, its
cleanup handlers included); the restart is a new Checkpoint and Preparer on the same directories."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from dra_helpers import DRIVER, NIC0, NIC1, Dirs, idle, put_claim, ref, result, start_preparer

from nodefabric_devicemanager.accelerators import Libraries
from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder
from nodefabric_deviceplugin.dra import cdi, hops
from nodefabric_deviceplugin.dra.checkpoint import Checkpoint, PreparedClaim
from nodefabric_deviceplugin.source import RecordSource
from nodefabric_operator.demo.kubeapi import RunningAPI

_BY_PATH = ("open", "replace", "rename", "unlink", "mkdir")
_BY_FD = ("write", "close", "fchmod", "fsync", "fdatasync")


class Killed(OSError):
    """The process died at this call (an OSError, so the hop ends the way a dead thread would not; the
    calls after it, cleanup included, all fail too, so the disk stays as the kill left it)."""


class Kill:
    """Kill the driver at its `at`-th system call under `base` (None: never); counts them all."""

    def __init__(self, base: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.base = base
        self.at: int | None = None
        self.calls = 0
        self.dead = False
        self.fds: set[int] = set()
        self._lock = threading.Lock()
        for name in _BY_PATH + _BY_FD:
            monkeypatch.setattr(os, name, self._wrap(name, getattr(os, name)))

    def arm(self, at: int | None) -> None:
        self.at, self.calls, self.dead = at, 0, False

    def _ours(self, name: str, args: tuple[Any, ...]) -> bool:
        if name in _BY_FD:
            return bool(args) and args[0] in self.fds
        return bool(args) and isinstance(args[0], str) and args[0].startswith(self.base)

    def _wrap(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kw: Any) -> Any:
            if not self._ours(name, args):
                return real(*args, **kw)
            with self._lock:
                if not self.dead and self.at is not None and self.calls >= self.at:
                    self.dead = True
                self.calls += 1
                if self.dead:
                    raise Killed(5, f"killed at {name}")
            out = real(*args, **kw)
            if name == "open":
                self.fds.add(out)
            elif name == "close":
                self.fds.discard(args[0])
            return out

        return call


def at(base: str, n: int) -> Dirs:
    return Dirs(plugin=f"{base}/{n}/plugins", registry=f"{base}/{n}/reg", cdi=f"{base}/{n}/cdi")


def temporaries(directory: str) -> list[str]:
    try:
        return [n for n in os.listdir(directory) if n.endswith(".tmp")]
    except FileNotFoundError:
        return []


@pytest.fixture
def kill(dirs: Dirs, monkeypatch: pytest.MonkeyPatch) -> Iterator[Kill]:
    yield Kill(os.path.dirname(dirs.cdi), monkeypatch)


async def kill_every_call(
    api: RunningAPI,
    dirs: Dirs,
    hgx_host: tuple[SysfsBuilder, Libraries],
    hgx_spec: DevicesSpec,
    kill: Kill,
    *,
    warm: bool,
    unprepare: bool = False,
    rewrite: bool = False,
) -> list[tuple[int, bool, str, bool, Checkpoint]]:
    """For every call N of one claim's prepare (or unprepare; or, `rewrite`, a repeated prepare that
    rewrites the claim's lost spec): kill there, restart. Returns, per N,
    whether kubelet was answered success, where the claim's spec is, whether the kill left it there
    and the checkpoint as the restart found it. After each restart the claim is prepared again, as
    kubelet retries: it is answered whole, with its spec on disk."""
    base = os.path.dirname(dirs.cdi)
    host = hgx_host[0].host
    source = RecordSource(hgx_spec)
    claim = put_claim(api, "victim", [result(NIC0), result(NIC1, request="other")])
    other = put_claim(api, "warm", [result(NIC1)])
    out: list[tuple[int, bool, str, bool, Checkpoint]] = []
    for n in range(200):
        d = at(base, n)
        kill.arm(None)
        p = start_preparer(api, d, host, source)
        if warm:  # the verbs devices cached and the directories made: the one-hop path
            assert (await p.prepare([ref(other)]))[ref(other).uid].error == ""
        if unprepare or rewrite:
            assert (await p.prepare([ref(claim)]))[ref(claim).uid].error == ""
        if rewrite:
            os.unlink(cdi.spec_path(d.cdi, DRIVER, ref(claim).uid))
        await p.syncs.drain(5)
        kill.arm(n)
        if unprepare:
            told = (await p.unprepare([ref(claim)]))[ref(claim).uid] == ""
        else:
            told = (await p.prepare([ref(claim)]))[ref(claim).uid].error == ""
        await p.syncs.drain(5)
        finished = not kill.dead
        kill.arm(None)
        spec = cdi.spec_path(d.cdi, DRIVER, ref(claim).uid)
        restarted = start_preparer(api, d, host, source)
        out.append((n, told, spec, os.path.exists(spec), Checkpoint(restarted.checkpoint.path)))
        again = (await restarted.prepare([ref(claim)]))[ref(claim).uid]
        assert again.error == "" and len(again.devices) == 2, f"killed at call {n}: {again.error}"
        assert os.path.exists(spec), f"killed at call {n}: prepared again without its spec"
        await restarted.syncs.drain(5)
        if finished:
            return out
    raise AssertionError("a prepare of more than 200 calls")


@pytest.mark.parametrize("warm", [True, False], ids=["one hop", "two hops, first write"])
async def test_a_prepare_killed_at_any_call_leaves_no_spec_kubelet_cannot_find_in_the_checkpoint(
    api: RunningAPI,
    dirs: Dirs,
    hgx_host: tuple[SysfsBuilder, Libraries],
    hgx_spec: DevicesSpec,
    *,
    kill: Kill,
    warm: bool,
) -> None:
    """Killed at any call, restarted: a claim kubelet was answered is in the checkpoint with its spec;
    a spec on disk always has its entry (a spec the checkpoint does not name is a claim kubelet may
    never unprepare: it would stay in the runtime's directory for good)."""
    runs = await kill_every_call(api, dirs, hgx_host, hgx_spec, kill, warm=warm)
    assert len(runs) > 8, "the prepare made fewer calls than its files need"
    for n, told, spec, left, ck in runs:
        uid = os.path.basename(spec).removeprefix(f"{DRIVER}-nic_").removesuffix(".json")
        held = ck.get(uid)
        if told:
            assert held is not None and held.spec and held.spec_path == spec, f"killed at call {n}"
        if left:
            assert held is not None, f"killed at call {n}: a spec is left that no checkpoint entry names"


@pytest.mark.parametrize("warm", [True, False], ids=["one hop", "two hops, first write"])
async def test_a_prepare_killed_at_any_call_then_restarted_leaves_no_temporary_file(
    api: RunningAPI,
    dirs: Dirs,
    hgx_host: tuple[SysfsBuilder, Libraries],
    hgx_spec: DevicesSpec,
    *,
    kill: Kill,
    warm: bool,
) -> None:
    """A kill between a spec's temporary file and its rename leaves a `.tmp` in the runtime's CDI
    directory; the restarted driver removes its own (and only its own) leftovers there."""
    base = os.path.dirname(dirs.cdi)
    runs = await kill_every_call(api, dirs, hgx_host, hgx_spec, kill, warm=warm)
    for n, _, spec, _, ck in runs:
        assert temporaries(ck.directory) == [], f"killed at call {n}"
        assert temporaries(os.path.dirname(spec)) == [], f"killed at call {n}"
    # Someone else's temporary file in the CDI directory is not ours to remove.
    d = at(base, 0)
    foreign = os.path.join(d.cdi, ".other.example.com-nic_x.json.0123456789ab.tmp")
    os.makedirs(d.cdi, exist_ok=True)
    open(foreign, "w").close()
    start_preparer(api, d, hgx_host[0].host, RecordSource(hgx_spec))
    assert os.path.exists(foreign)


async def test_an_unprepare_killed_at_any_call_leaves_the_claim_whole_or_gone(
    api: RunningAPI,
    dirs: Dirs,
    hgx_host: tuple[SysfsBuilder, Libraries],
    hgx_spec: DevicesSpec,
    kill: Kill,
) -> None:
    """Killed at any call of an unprepare: an unprepare kubelet was answered left neither file; one it
    was not leaves the claim in the checkpoint (kubelet unprepares it again), and a prepare after the
    restart answers it whole, spec included."""
    runs = await kill_every_call(api, dirs, hgx_host, hgx_spec, kill, warm=True, unprepare=True)
    assert len(runs) > 3
    for n, told, spec, left, ck in runs:
        uid = os.path.basename(spec).removeprefix(f"{DRIVER}-nic_").removesuffix(".json")
        if told:
            assert ck.get(uid) is None and not left, f"killed at call {n}"
        elif left:
            assert ck.get(uid) is not None, f"killed at call {n}: a spec without its entry"


# In a process of its own: the refused start must be the process's first, and the thread a later sync
# starts lives as long as the process (a worker shared with other tests would count two).
THREAD_LIMIT = """
import asyncio, logging, sys, threading
from prometheus_client import REGISTRY
from nodefabric_deviceplugin.dra.checkpoint import Checkpoint, PreparedClaim
from nodefabric_deviceplugin.dra.syncs import Syncs

logging.basicConfig(format="%(message)s %(why)s")
real_start = threading.Thread.start
refused = []


def at_limit(self):
    if self.name == "dra-sync" and not refused:
        refused.append(self.name)
        raise RuntimeError("can't start new thread")
    real_start(self)


threading.Thread.start = at_limit


async def main():
    checkpoint = Checkpoint(sys.argv[1])
    syncs = Syncs()
    for uid in ("u-1", "u-2"):
        entry = checkpoint.reserve(uid)
        entry.commit(PreparedClaim(uid, "ml", "c", (), ""))
        syncs.start(entry)
        print(uid, await syncs.drain(5), len(syncs), flush=True)
    names = [t.name for t in threading.enumerate()]
    print(refused, names.count("dra-sync"), REGISTRY.get_sample_value(
        "nodefabric_dra_checkpoint_sync_failures_total"), sorted(Checkpoint(sys.argv[1]).claims), flush=True)


asyncio.run(main())
"""


def test_a_sync_thread_that_cannot_start_fails_that_sync_and_the_next_one_starts_it(tmp_path: Path) -> None:
    """The process is at its thread limit when its first sync is due (`can't start new thread`): that
    sync fails (logged, counted; the claim stays prepared) instead of waiting out the stop's bound, and
    the next sync starts the thread; no sync of the process stays queued behind a thread never run."""
    out = subprocess.run(
        [sys.executable, "-c", THREAD_LIMIT, str(tmp_path / "checkpoint.json")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "u-1 True 0",
        "u-2 True 0",
        "['dra-sync'] 1 1.0 ['u-1', 'u-2']",
    ], (out.stdout, out.stderr)
    assert "could not be synced" in out.stderr and "can't start new thread" in out.stderr, out.stderr


@pytest.mark.parametrize("first", ["prepare", "unprepare"])
async def test_a_call_cancelled_at_any_step_then_its_opposite_leaves_the_opposite_whole(
    api: RunningAPI,
    dirs: Dirs,
    hgx_host: tuple[SysfsBuilder, Libraries],
    hgx_spec: DevicesSpec,
    first: str,
) -> None:
    """kubelet's deadline at every step of a prepare (or an unprepare), cancelled twice, and the
    opposite call of the same claim sent at once: whichever answers last decides, whole. An unprepare
    answered leaves neither file; a prepare answered leaves both, its entry naming its spec."""
    p = start_preparer(api, dirs, hgx_host[0].host, RecordSource(hgx_spec))
    claim = ref(put_claim(api, "raced", [result(NIC0), result(NIC1, request="other")]))
    spec = cdi.spec_path(dirs.cdi, DRIVER, claim.uid)
    for steps in range(60):
        if first == "unprepare":  # the claim held, its unprepare cancelled
            assert (await p.prepare([claim]))[claim.uid].error == ""
            cancelled = asyncio.create_task(p.unprepare([claim]))
        else:
            cancelled = asyncio.create_task(p.prepare([claim]))
        for _ in range(steps):
            await asyncio.sleep(0)
        cancelled.cancel()
        if first == "unprepare":
            opposite: Any = asyncio.create_task(p.prepare([claim]))
        else:
            opposite = asyncio.create_task(p.unprepare([claim]))
        await asyncio.sleep(0)
        cancelled.cancel()
        answer = await asyncio.wait_for(opposite, 10)
        with contextlib.suppress(asyncio.CancelledError):
            await cancelled
        await p.syncs.drain(5)
        on_disk = Checkpoint(p.checkpoint.path).get(claim.uid)
        if first == "unprepare":
            assert answer[claim.uid].error == "", f"step {steps}"
            assert on_disk is not None and on_disk.spec_path == spec and os.path.exists(spec), f"step {steps}"
            assert claim.uid in p.checkpoint.claims
            assert (await p.unprepare([claim]))[claim.uid] == ""
        else:
            assert answer[claim.uid] == "", f"step {steps}"
            assert on_disk is None and claim.uid not in p.checkpoint.claims, f"step {steps}"
            assert not os.path.exists(spec), f"step {steps}: a spec outlived the unprepare answered after it"
        assert temporaries(dirs.cdi) == [] and temporaries(p.checkpoint.directory) == []


async def test_a_held_claim_whose_entry_names_another_file_as_its_spec_never_writes_it(
    api: RunningAPI, dirs: Dirs, hgx_host: tuple[SysfsBuilder, Libraries], hgx_spec: DevicesSpec
) -> None:
    """A checkpoint entry (tampered with, or from a bug) whose spec path is not the claim's own spec
    file: a repeated prepare must not write the spec there (an unprepare already refuses to remove any
    file but the claim's own); it fails the claim, saying why, and the file stays as it was."""
    config = dirs.config()
    claim = ref(put_claim(api, "held", [result(NIC0)]))
    victim = os.path.join(os.path.dirname(dirs.cdi), "victim.conf")
    with open(victim, "w") as f:
        f.write("keep\n")
    checkpoint = Checkpoint(config.checkpoint_path)
    checkpoint.put(PreparedClaim(claim.uid, claim.namespace, claim.name, (), victim, {"cdiVersion": "0.5.0"}))
    p = start_preparer(api, dirs, hgx_host[0].host, RecordSource(hgx_spec))
    out = (await p.prepare([claim]))[claim.uid]
    assert "spec" in out.error and victim in out.error and not out.devices
    with open(victim) as f:
        assert f.read() == "keep\n"
    # The claim's own spec path, in another CDI directory (--cdi-dir changed): moved to the current one.
    moved = cdi.spec_path(dirs.cdi + "-old", DRIVER, claim.uid)
    checkpoint.put(PreparedClaim(claim.uid, claim.namespace, claim.name, (), moved, {"cdiVersion": "0.5.0"}))
    p = start_preparer(api, dirs, hgx_host[0].host, RecordSource(hgx_spec))
    assert (await p.prepare([claim]))[claim.uid].error == "" and not os.path.exists(moved)
    assert os.path.exists(cdi.spec_path(dirs.cdi, DRIVER, claim.uid))


async def test_a_hop_whose_thread_cannot_start_is_refused_and_never_runs_later(
    api: RunningAPI,
    dirs: Dirs,
    hgx_host: tuple[SysfsBuilder, Libraries],
    hgx_spec: DevicesSpec,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The process at its thread limit, every hop thread busy: the hop needs a new thread and cannot
    start one (`can't start new thread`). kubelet is told the claim failed; the hop must not then run
    on the first thread that frees up, writing the claim's files after the lock was let go (kubelet,
    told it failed, may unprepare it meanwhile, or never call again)."""
    threads = hops.HopThreads()
    monkeypatch.setattr(hops, "THREADS", threads)
    p = start_preparer(api, dirs, hgx_host[0].host, RecordSource(hgx_spec))
    claim, warm = ref(put_claim(api, "limited", [result(NIC0)])), ref(put_claim(api, "warm", [result(NIC1)]))
    assert (await p.prepare([warm]))[warm.uid].error == ""  # the verbs cached: one hop writes the files
    busy, running = threading.Event(), threading.Semaphore(0)

    def occupy() -> None:
        running.release()
        busy.wait(30)

    await idle(threads)
    threads.submit(occupy)  # the one thread the warm prepare started, now busy
    assert running.acquire(timeout=10) and threads._threads == 1
    real_start = threading.Thread.start

    def at_limit(self: threading.Thread) -> None:
        if self.name.startswith("dra-hop"):
            raise RuntimeError("can't start new thread")
        real_start(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(threading.Thread, "start", at_limit)
        out = (await p.prepare([claim]))[claim.uid]
    assert "can't start new thread" in out.error and not out.devices
    busy.set()
    # The busy thread is free again (idle): were the refused hop queued, it would have run on it by now,
    # and a hop after it runs on that thread, after anything queued before it.
    await idle(threads)
    assert await asyncio.wait_for(hops.finish(claim, hops.hop(lambda: "after")), 10) == "after"
    await p.syncs.drain(5)
    assert claim.uid not in p.checkpoint.claims and Checkpoint(p.checkpoint.path).get(claim.uid) is None
    assert not os.path.exists(cdi.spec_path(dirs.cdi, DRIVER, claim.uid)), "the refused hop ran later"


async def test_a_repeated_prepare_killed_while_rewriting_a_lost_spec_keeps_the_claim(
    api: RunningAPI,
    dirs: Dirs,
    hgx_host: tuple[SysfsBuilder, Libraries],
    hgx_spec: DevicesSpec,
    kill: Kill,
) -> None:
    """The spec lost (a reboot emptied the runtime's directory), the repeated prepare that rewrites it
    killed at any call: the claim stays in the checkpoint, a rewrite kubelet was answered left the spec
    in place, and no temporary file outlives the restart."""
    runs = await kill_every_call(api, dirs, hgx_host, hgx_spec, kill, warm=True, rewrite=True)
    assert len(runs) > 3
    for n, told, spec, left, ck in runs:
        uid = os.path.basename(spec).removeprefix(f"{DRIVER}-nic_").removesuffix(".json")
        assert ck.get(uid) is not None, f"killed at call {n}"
        assert left or not told, f"killed at call {n}: answered without its spec"
        assert temporaries(os.path.dirname(spec)) == [], f"killed at call {n}"
