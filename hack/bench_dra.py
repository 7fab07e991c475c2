"""Benchmark the DRA driver over real unix sockets and real HTTP, against baselines measured in the same run.

    python hack/bench_dra.py [--claims 200] [--rounds 3] [--pfs 8] [--vfs 128] [--profile DIR]

Figures:
- NodePrepareResources of one claim (one device): the first prepare (reads the ResourceClaim from the
  API, resolves the verbs device, writes the CDI spec and the checkpoint entry, all in one thread hop
  since the probe claim warmed the verbs cache; the entry's syncs follow the answer), a repeated
  prepare (answered from the checkpoint), and NodeUnprepareResources, each against an empty
  NodeUnprepareResources call on the same channel (the gRPC floor) and, for the first prepare, against
  a bare GET of the claim (the API floor) and against the two together (what no driver avoids). These
  run against the embedded API in its own process, as a real API server is (in this process its request
  handling shared the driver's event loop). The first prepare and the unprepare of the write path before
  (the entry synced before kubelet's answer; `record_before`) are interleaved with them. The GET floor
  is `asyncio.to_thread(get_claim)`: the driver's own client and one thread hop, as an asyncio driver
  reads a claim. Targets: the first prepare adds at most 20 ms (p50) to the GET; issue 24: at most x2
  the GET. The last lines put that ratio beside its floor in the same unit: a GET and an empty call
  together (a driver that reads the claim inside kubelet's call answers no sooner), and how far above
  that floor the first prepare is; then beside a ceiling, interleaved too: the same first prepare with
  its two files costing nothing (`record_in_memory`: recorded in memory only, not a driver), which
  splits what is above the floor into the files' share and the rest; and beside the same first prepare
  with its thread hops on the loop's default executor (`ExecutorHops`, as the driver ran them before its
  own hop threads), what those threads save; and the same claim's first prepare twice more, its spec
  spliced from its device's template (as the driver does) and built and encoded for it (as before the
  templates), alternating which goes first, for what the templates save. Those lines pool `--rounds`
  passes over the claims; the last one judges issue 24's x2 on the median of the rounds' own ratios (one
  pass swings by x0.1-0.3 from run to run on a shared machine) and says whether it is met.
- What a prepare costs as the number of claims already held grows (`--held`, default 1,500, against 10):
  the real NodePrepareResources (and its unprepare) with that many claims in the driver's checkpoint,
  against the same call with the whole-file checkpoint it replaced (every change rewrote and fsynced every
  claim; git 7626f9d), both in the same run. Target: the per-claim checkpoint costs the same at 1,500 held
  as at 10 (ratio about 1.0).
- What keeping a large pool's ResourceSlices (`--pfs` PFs with `--vfs` VFs each) right costs the API
  server per node-hour in the steady state: requests and response bytes. Before: a LIST of the node's
  slices every 60 s (the driver's old resync), each LIST measured here. After: the driver's own requests,
  counted by its client over many syncs (record re-deliveries, kubelet pokes, resyncs), plus the watch's
  own cost: a re-open every 300-600 s (450 s on average) and a bookmark about once a minute (a real API
  server's pace), each measured here by ending the watch and by advancing the API's resourceVersion.
- `--profile DIR`: where a first prepare's time goes, printed last. One more pass over the claims with
  each first prepare stamped from inside the driver (kubelet's call to the hop's start, the claim's GET,
  the hop's work after it, the hop's end to kubelet's answer; p50s beside a GET and an empty call), then
  one under cProfile, the loop's thread and the hop's each in its own profile (DIR/loop.prof,
  DIR/hop.prof; `python -m pstats`), with each one's busy time per call and its costliest own steps.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from nodefabric_devicemanager import inventory, nodeclient
from nodefabric_devicemanager.accelerators import Libraries
from nodefabric_devicemanager.accelerators.ascend import NoAscend
from nodefabric_devicemanager.accelerators.nvidia import NoNvidia
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_devicemanager.testing import scenarios
from nodefabric_deviceplugin.dra import hops
from nodefabric_deviceplugin.dra.checkpoint import (
    KIND,
    Checkpoint,
    PreparedClaim,
    PreparedDevice,
    Reservation,
    _checksum,
)
from nodefabric_deviceplugin.dra.claims import ClaimRef
from nodefabric_deviceplugin.dra.config import DriverConfig
from nodefabric_deviceplugin.dra.driver import DraDriver
from nodefabric_deviceplugin.dra.files import write_atomically
from nodefabric_deviceplugin.dra.kube import DraApi
from nodefabric_deviceplugin.dra.prepare import Preparer
from nodefabric_deviceplugin.source import RecordSource
from nodefabric_deviceplugin.testing.drakubelet import DraClient, DraKubelet
from nodefabric_operator.demo.kubeapi import RunningAPI, running_api

NODE = "bench-0"
SHM = "/dev/shm"
DRIVER = "rdma.gpustack.ai"


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(name: str, samples: list[float], baseline: list[float], floor: str) -> None:
    p50, p90, p99 = (percentile(samples, q) * 1e3 for q in (0.5, 0.9, 0.99))
    b50 = percentile(baseline, 0.5) * 1e3
    print(
        f"{name:<34} p50 {p50:8.3f} ms  p90 {p90:8.3f} ms  p99 {p99:8.3f} ms  {floor} p50 {b50:7.3f} ms"
        f"  x{p50 / b50:.2f}"
    )


HOUR_S = 3600.0
OLD_RESYNC_S = 60.0  # the driver listed its slices this often before it held a watch
WATCH_REOPEN_S = 450.0  # the mean of the watch's random 300-600 s timeout
BOOKMARK_S = 60.0  # a real API server's bookmark pace on an idle watch


def put_node(k: RunningAPI) -> None:
    k.api.put_object("v1/nodes", {"metadata": {"name": NODE}})


def claim(k: RunningAPI, name: str, device: str) -> ClaimRef:
    uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"bench/{name}"))  # the same in the API's own process
    result = {"request": "nic", "driver": DRIVER, "pool": NODE, "device": device}
    k.api.put_object(
        "resource.k8s.io/v1/resourceclaims",
        {
            "metadata": {"name": name, "namespace": "bench", "uid": uid},
            "status": {"allocation": {"devices": {"results": [result]}}},
        },
    )
    return ClaimRef("bench", uid, name)


async def _time(call: Callable[[], Awaitable[object]]) -> float:
    start = time.perf_counter()
    await call()
    return time.perf_counter() - start


def record_before(preparer: Preparer) -> Callable[[str, PreparedClaim], Reservation]:
    """The baseline's write path (git d949c4b, less its overlap of the directory fsync with the read):
    the same files, synced before kubelet is answered, in the same thread hop as the writes."""

    def record(path: str, prepared: PreparedClaim, text: str | None = None) -> Reservation:
        entry = Preparer._record(preparer, path, prepared, text)
        entry.sync()
        return entry

    return record


def record_in_memory(preparer: Preparer) -> Callable[[str, PreparedClaim], Reservation]:
    """Not a driver: a ceiling. The claim is recorded in memory only (no checkpoint entry, no CDI spec,
    so no sync either), everything else as the driver does it: what a first prepare would cost if its
    two files cost nothing, i.e. the most any change to how they are written could win."""

    def record(path: str, prepared: PreparedClaim, text: str | None = None) -> Reservation:
        preparer.checkpoint.claims[prepared.uid] = prepared
        # Never committed: its sync is a no-op, and the unprepare finds no file to remove.
        return Reservation(preparer.checkpoint, prepared.uid, path, -1)

    return record


DEVICE = "pci-0000-11-00-1"  # the bench tree's first VF, the one given a verbs device


def claim_names(claims: int) -> list[tuple[str, str, str, str]]:
    """Per round: the claim the driver prepares, the one the write path before prepares, the one the
    ceiling without files prepares, and the one prepared with its hops on the loop's default executor."""
    return [(f"c{i}", f"b{i}", f"n{i}", f"e{i}") for i in range(claims)]


class ExecutorHops(hops.HopThreads):
    """The baseline for the driver's own hop threads: every hop submitted to the loop's default executor,
    as the driver ran them before (git ffa09bd): `run_in_executor` builds a concurrent future and an
    asyncio one wrapping it, and wakes the loop a second time as the hop ends."""

    def submit(self, job: Callable[[], None]) -> None:
        asyncio.get_running_loop().run_in_executor(None, job)


async def serve_api(directory: str, claims: int) -> int:
    """The API in its own process (`--serve-api`), as a real API server is: its request handling does not
    share the driver's event loop and interpreter. Seeds the node and the claims, prints its kubeconfig,
    and serves until its standard input closes."""
    async with running_api(directory=directory) as k:
        put_node(k)
        for names in [*claim_names(claims), ("probe",)]:
            for name in names:
                claim(k, name, DEVICE)
        print(k.kubeconfig, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    return 0


def ref(name: str) -> ClaimRef:
    return ClaimRef("bench", str(uuid.uuid5(uuid.NAMESPACE_URL, f"bench/{name}")), name)


def verdict(rounds: list[dict[str, list[float]]]) -> str:
    """Issue 24's target (the first prepare's p50 at most x2.0 the claim GET's), judged on the median of
    the rounds' own ratios: one round's figure swings by x0.1-0.3 from run to run on a shared machine."""
    ratios = sorted(percentile(r["first"], 0.5) / percentile(r["get"], 0.5) for r in rounds)
    floors = sorted(
        (percentile(r["get"], 0.5) + percentile(r["empty"], 0.5)) / percentile(r["get"], 0.5) for r in rounds
    )
    before = statistics.median(
        percentile(r["first executor"], 0.5) / percentile(r["get"], 0.5) for r in rounds
    )
    built = statistics.median(percentile(r["first built"], 0.5) / percentile(r["get"], 0.5) for r in rounds)
    templated = statistics.median(
        percentile(r["first templated"], 0.5) / percentile(r["get"], 0.5) for r in rounds
    )
    ratio, floor = statistics.median(ratios), statistics.median(floors)
    met = "met" if ratio <= TARGET else "not met"
    return (
        f"target x{TARGET:.1f} the claim GET (p50, median of {len(rounds)} rounds): prepare, first"
        f" x{ratio:.2f} ({' '.join(f'x{r:.2f}' for r in ratios)}): {met}; its floor x{floor:.2f};"
        f" with its hops on the default executor (before) x{before:.2f}; side by side, its spec from its"
        f" device's template x{templated:.2f}, built for each claim (before) x{built:.2f}"
    )


TARGET = 2.0  # issue 24: a first prepare at most twice a claim GET


async def bench_prepare(
    driver: DraDriver,
    api: DraApi,
    plugin: DraClient,
    *,
    claims: int,
    rounds: int,
    profile: Path | None = None,
) -> list[str]:
    """Each figure interleaved with its floor, claim by claim, so a machine shared with other work slows
    both alike; the write path before (the entry synced before the answer) interleaved too. `rounds`
    passes over the claims (an unprepared claim is prepared from the API again); every line but the
    last pools them, the last judges the target on the median of the rounds' ratios."""
    preparer = driver.preparer
    refs = [(ref(c), ref(b), ref(n), ref(e)) for c, b, n, e in claim_names(claims)]
    probe = ref("probe")
    answer = (await plugin.prepare(probe))[probe.uid]
    assert answer.error == "", answer.error  # a failing prepare would time the wrong path
    await plugin.unprepare(probe)
    names = (
        "get", "empty", "first", "again", "gone", "first before", "gone before", "first no files",
        "first executor", "first templated", "first built",
    )  # fmt: skip
    figures: dict[str, list[float]] = {n: [] for n in names}
    per_round: list[dict[str, list[float]]] = []
    try:
        for _ in range(rounds):
            per_round.append(await _prepare_round(preparer, api, plugin, refs, names))
    finally:
        preparer.__dict__.pop("_record", None)
    for one in per_round:
        for name in names:
            figures[name].extend(one[name])
    _report_prepare(figures)
    print(verdict(per_round))
    if profile is None:
        return []
    first = [r for r, _, _, _ in refs]
    return [*await _phases(preparer, api, plugin, first), *await _profiled(preparer, plugin, first, profile)]


async def _phases(preparer: Preparer, api: DraApi, plugin: DraClient, refs: list[ClaimRef]) -> list[str]:
    """`--profile`: one more pass, each first prepare stamped from inside the driver (its hop's start, the
    claim's GET, the hop's end), beside its floors: where the distance to a GET + an empty call is."""
    marks: dict[str, float] = {}
    get_claim, read_and_write = preparer.api.get_claim, preparer._read_and_write

    def stamped_get(namespace: str, name: str) -> dict[str, Any] | None:
        marks["get"] = time.perf_counter()
        try:
            return get_claim(namespace, name)
        finally:
            marks["read"] = time.perf_counter()

    def stamped_hop(*args: Any) -> Any:
        marks["hop"] = time.perf_counter()
        try:
            return read_and_write(*args)
        finally:
            marks["end"] = time.perf_counter()

    phases: dict[str, list[float]] = {
        "a GET (floor)": [], "an empty call (floor)": [], "kubelet's call to the hop": [],
        "the GET in the hop": [], "the hop after the GET": [], "the hop's end to kubelet's answer": [],
    }  # fmt: skip
    preparer.api.get_claim = stamped_get  # type: ignore[method-assign]
    preparer._read_and_write = stamped_hop  # type: ignore[method-assign]
    try:
        for r in refs:
            phases["a GET (floor)"].append(
                await _time(lambda r=r: asyncio.to_thread(api.get_claim, r.namespace, r.name))
            )  # type: ignore[misc]
            phases["an empty call (floor)"].append(await _time(plugin.unprepare))
            start = time.perf_counter()
            await plugin.prepare(r)
            done = time.perf_counter()
            phases["kubelet's call to the hop"].append(marks["hop"] - start)
            phases["the GET in the hop"].append(marks["read"] - marks["get"])
            phases["the hop after the GET"].append(marks["end"] - marks["read"])
            phases["the hop's end to kubelet's answer"].append(done - marks["end"])
            await plugin.unprepare(r)
    finally:
        del preparer.api.get_claim, preparer._read_and_write
    return [
        f"profile, first prepare, p50 of each phase: {name} {percentile(v, 0.5) * 1e3:.3f} ms"
        for name, v in phases.items()
    ]


async def _profiled(
    preparer: Preparer, plugin: DraClient, refs: list[ClaimRef], directory: Path
) -> list[str]:
    """`--profile`: one more pass under cProfile, the event loop's thread and the hop's thread each in a
    profile of its own (`loop.prof`, `hop.prof` in `directory`), with each one's busy time per call (its
    own time less the waits: the loop's epoll, the hop's socket reads) and its costliest own steps."""
    loop_profile, hop_profile = cProfile.Profile(), cProfile.Profile()
    read_and_write = preparer._read_and_write

    def profiled_hop(*args: Any) -> Any:
        return hop_profile.runcall(read_and_write, *args)

    preparer._read_and_write = profiled_hop  # type: ignore[method-assign]
    try:
        for r in refs:
            loop_profile.enable()
            await plugin.prepare(r)
            loop_profile.disable()
            await plugin.unprepare(r)
    finally:
        del preparer._read_and_write
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for name, profile in (("loop", loop_profile), ("hop", hop_profile)):
        profile.dump_stats(str(directory / f"{name}.prof"))
        out.append(_busy(name, pstats.Stats(profile), len(refs), directory / f"{name}.prof"))
    return out


WAITS = ("<method 'poll' of 'select.epoll' objects>", "<method 'recv_into' of '_socket.socket' objects>")


def _busy(name: str, stats: pstats.Stats, calls: int, path: Path) -> str:
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, Any]] = stats.stats  # type: ignore[attr-defined]
    own = sum(v[2] for v in raw.values())
    waits = sum(v[2] for k, v in raw.items() if k[2] in WAITS)
    top = sorted(((v[2], k) for k, v in raw.items() if k[2] not in WAITS), reverse=True)[:5]
    steps = ", ".join(f"{os.path.basename(k[0])}:{k[2]} {t / calls * 1e6:.0f} us" for t, k in top)
    return (
        f"profile, first prepare, {name} thread ({path}): busy {(own - waits) / calls * 1e3:.3f} ms a call"
        f" under cProfile (waiting {waits / calls * 1e3:.3f} ms); its costliest own steps: {steps}"
    )


async def _prepare_round(
    preparer: Preparer,
    api: DraApi,
    plugin: DraClient,
    refs: list[tuple[ClaimRef, ClaimRef, ClaimRef, ClaimRef]],
    names: tuple[str, ...],
) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {n: [] for n in names}
    own, executor = hops.THREADS, ExecutorHops()
    for r, b, n, e in refs:
        get = (api.get_claim, r.namespace, r.name)
        figures["get"].append(await _time(lambda get=get: asyncio.to_thread(*get)))  # type: ignore[misc]
        figures["empty"].append(await _time(plugin.unprepare))
        figures["first"].append(await _time(lambda r=r: plugin.prepare(r)))  # type: ignore[misc]
        figures["again"].append(await _time(lambda r=r: plugin.prepare(r)))  # type: ignore[misc]
        figures["gone"].append(await _time(lambda r=r: plugin.unprepare(r)))  # type: ignore[misc]
        await _templates_or_not(preparer, plugin, r, figures, built_first=len(figures["first"]) % 2 == 0)
        preparer._record = record_before(preparer)  # type: ignore[method-assign,assignment]
        figures["first before"].append(await _time(lambda b=b: plugin.prepare(b)))  # type: ignore[misc]
        figures["gone before"].append(await _time(lambda b=b: plugin.unprepare(b)))  # type: ignore[misc]
        preparer._record = record_in_memory(preparer)  # type: ignore[method-assign,assignment]
        figures["first no files"].append(await _time(lambda n=n: plugin.prepare(n)))  # type: ignore[misc]
        await plugin.unprepare(n)
        del preparer._record  # the class's own again
        hops.THREADS = executor
        try:
            figures["first executor"].append(await _time(lambda e=e: plugin.prepare(e)))  # type: ignore[misc]
            await plugin.unprepare(e)
        finally:
            hops.THREADS = own
    return figures


async def _templates_or_not(
    preparer: Preparer, plugin: DraClient, r: ClaimRef, figures: dict[str, list[float]], *, built_first: bool
) -> None:
    """The same claim's first prepare twice more (read from the API again each time, then unprepared):
    its spec spliced from its device's template, as the driver does, and built and encoded for it, as
    before the templates; which goes first alternates claim by claim, so neither always follows the
    other's unprepare."""
    for built in (True, False) if built_first else (False, True):
        if built:
            preparer._templates.get = lambda *_: None  # type: ignore[method-assign]
        try:
            name = "first built" if built else "first templated"
            figures[name].append(await _time(lambda: plugin.prepare(r)))
            await plugin.unprepare(r)
        finally:
            preparer._templates.__dict__.pop("get", None)


def _report_prepare(figures: dict[str, list[float]]) -> None:
    report("prepare, first (API + spec + entry)", figures["first"], figures["get"], "claim GET")
    report("prepare, first", figures["first"], figures["empty"], "empty call")
    report("prepare, again (checkpoint)", figures["again"], figures["empty"], "empty call")
    report("unprepare (spec + fsync)", figures["gone"], figures["empty"], "empty call")
    added = percentile(figures["first"], 0.5) - percentile(figures["get"], 0.5)
    print(f"target: the first prepare adds <= 20 ms to the claim GET (p50 adds {added * 1e3:.1f} ms)")
    report("prepare, first, before", figures["first before"], figures["get"], "claim GET")
    report("unprepare, before", figures["gone before"], figures["empty"], "empty call")
    # What no driver can avoid: kubelet's call itself and the claim's read.
    floor = percentile(figures["get"], 0.5) + percentile(figures["empty"], 0.5)
    now, then = percentile(figures["first"], 0.5), percentile(figures["first before"], 0.5)
    print(
        f"prepare, first against a claim GET + an empty call ({floor * 1e3:.3f} ms): x{now / floor:.2f}"
        f" (before x{then / floor:.2f}); target x2.0 against the GET alone"
    )
    # The ratio issue 24 sets (against the GET alone) beside its floor in the same unit: no driver that
    # reads the claim inside kubelet's call answers under a GET + an empty call.
    get50, get90 = percentile(figures["get"], 0.5), percentile(figures["get"], 0.9)
    first90 = percentile(figures["first"], 0.9)
    print(
        f"against the claim GET alone: prepare, first x{now / get50:.2f} (p90 x{first90 / get90:.2f}),"
        f" its floor (a GET + an empty call) x{floor / get50:.2f}, above the floor"
        f" {(now - floor) * 1e3:.3f} ms"
    )
    # How much of what is above the floor is the two files: the same prepare with them costing nothing.
    bare = percentile(figures["first no files"], 0.5)
    print(
        f"prepare, first without its two files (a ceiling, not a driver) x{bare / get50:.2f} the GET:"
        f" the files cost {(now - bare) * 1e3:.3f} ms, the rest above the floor {(bare - floor) * 1e3:.3f} ms"
    )
    executor = percentile(figures["first executor"], 0.5)
    print(
        f"prepare, first with its hops on the loop's default executor (before) x{executor / get50:.2f} the"
        f" GET: the driver's own hop threads save {(executor - now) * 1e3:.3f} ms"
    )
    built, templated = percentile(figures["first built"], 0.5), percentile(figures["first templated"], 0.5)
    print(
        f"prepare, first again, side by side: its spec from its device's template x{templated / get50:.2f}"
        f" the GET, built and encoded for each claim (before) x{built / get50:.2f}: the templates save"
        f" {(built - templated) * 1e3:.3f} ms"
    )


class WholeFileCheckpoint(Checkpoint):
    """The baseline: the checkpoint before per-claim files (git 7626f9d), which rewrote and fsynced one
    JSON file holding every claim on every change."""

    def put(self, claim: PreparedClaim) -> None:
        self.claims[claim.uid] = claim
        self._save()

    def remove(self, uid: str) -> None:
        if self.claims.pop(uid, None) is not None:
            self._save()

    def _save(self) -> None:
        claims = {uid: c.wire() for uid, c in sorted(self.claims.items())}
        doc = {"kind": KIND, "version": 1, "claims": claims, "checksum": _checksum(claims)}
        write_atomically(self.path, json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n", mode=0o600)


def held_claim(i: int, device: str) -> PreparedClaim:
    """A prepared claim as the driver records one (one device, its CDI spec), held by someone else."""
    uid = str(uuid.UUID(int=i))
    ids = (f"{DRIVER}/nic={uid}-{device}",)
    spec = {
        "cdiVersion": "0.6.0",
        "kind": f"{DRIVER}/nic",
        "devices": [
            {
                "name": f"{uid}-{device}",
                "containerEdits": {"deviceNodes": [{"path": "/dev/infiniband/uverbs9"}]},
            }
        ],
        "containerEdits": {
            "env": ["NCCL_IB_HCA=mlx5_9"],
            "deviceNodes": [{"path": "/dev/infiniband/rdma_cm"}],
        },
    }
    return PreparedClaim(
        uid, "held", f"h{i}", (PreparedDevice(("nic",), NODE, device, ids),), f"/cdi/{uid}.json", spec
    )


async def bench_held(
    k: RunningAPI, driver: DraDriver, plugin: DraClient, device: str, *, held: int, rounds: int, work: Path
) -> None:
    """NodePrepareResources + NodeUnprepareResources of one claim with 10 and `held` claims already held,
    with the per-claim checkpoint and with the whole-file one; each figure interleaved with the others."""
    preparer = driver.preparer
    own = preparer.checkpoint
    kinds: dict[str, Checkpoint] = {}
    for counted in (10, held):
        for name, cls in (("per-claim", Checkpoint), ("whole-file", WholeFileCheckpoint)):
            cp = cls(str(work / f"held-{name}-{counted}" / "checkpoint.json"))
            for i in range(counted):
                if cls is Checkpoint:
                    cp.put(held_claim(i, device))
                else:
                    cp.claims[held_claim(i, device).uid] = held_claim(i, device)
            kinds[f"{name} {counted}"] = cp
    refs = [claim(k, f"held{i}", device) for i in range(rounds)]
    figures: dict[str, list[float]] = {name: [] for name in kinds}
    try:
        for r in refs:
            for name, cp in kinds.items():
                preparer.checkpoint = cp

                async def cycle(r: ClaimRef = r) -> None:
                    answer = (await plugin.prepare(r))[r.uid]
                    assert answer.error == "", answer.error
                    await plugin.unprepare(r)

                figures[name].append(await _time(cycle))
    finally:
        preparer.checkpoint = own
    for name in ("per-claim", "whole-file"):
        few, many = figures[f"{name} 10"], figures[f"{name} {held}"]
        label = f"prepare+unprepare, {held:,} held, {name}"
        report(label, many, few, "10 held")
    ratio = percentile(figures[f"whole-file {held}"], 0.5) / percentile(figures[f"per-claim {held}"], 0.5)
    print(f"at {held:,} held the whole-file checkpoint costs x{ratio:.1f} the per-claim one (p50)")


async def _until(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        await asyncio.sleep(0.02)


def _cost(client: nodeclient.Api) -> tuple[int, int]:
    return client.requests, client.bytes_received


async def bench_steady(k: RunningAPI, driver: DraDriver, baseline: DraApi, rounds: int) -> None:
    """Requests and bytes per node-hour of keeping the slices right, before (LIST every 60 s) and after."""
    ours = driver.publisher.api
    assert isinstance(ours, DraApi)
    publisher, source = driver.publisher, driver.source
    # Before: the LIST the old driver made every resync.
    start = _cost(baseline.api)
    for _ in range(rounds):
        await asyncio.to_thread(baseline.list_slices)
    requests, received = (b - a for a, b in zip(start, _cost(baseline.api), strict=True))
    list_bytes = received / rounds
    assert requests == rounds
    # After, the syncs: every agent pass re-delivers the record, kubelet pokes, the resync comes.
    start, syncs = _cost(ours.api), publisher.syncs
    publisher.resync = 0.01
    for _ in range(rounds):
        spec = source.spec
        assert spec is not None
        source.update(spec.model_copy(deep=True))
        publisher.poke()
        await asyncio.sleep(0)
    await _until(lambda: publisher.syncs >= syncs + 2 * rounds, "the syncs")
    publisher.resync = 3600
    sync_requests, sync_bytes = (b - a for a, b in zip(start, _cost(ours.api), strict=True))
    assert publisher.last_plan is not None and publisher.last_plan.writes == 0
    # After, the watch: re-opened where it was when the server ends it (after 300-600 s; here after a
    # moment, so the watch is told a moment is healthy, or it would pace its re-opens as failures)...
    publisher.watch.healthy_after = 0.1
    start = _cost(ours.api)
    for _ in range(rounds):
        connects = publisher.watch.connects
        await asyncio.sleep(0.15)
        k.api.close_watches()
        await _until(lambda c=connects: publisher.watch.connects > c, "the watch to re-open")  # type: ignore[misc]
    await asyncio.sleep(0.2)
    reopen_requests, reopen_bytes = (b - a for a, b in zip(start, _cost(ours.api), strict=True))
    # ...and a bookmark whenever the API's resourceVersion moved on (other objects change all the time).
    k.api.bookmark_interval = 0.05
    connects = publisher.watch.connects
    await asyncio.sleep(0.15)
    k.api.close_watches()
    await _until(lambda: publisher.watch.connects > connects, "the watch to re-open")
    await asyncio.sleep(0.3)
    start = _cost(ours.api)
    for i in range(rounds):
        received = ours.api.bytes_received
        k.api.put_object("v1/nodes", {"metadata": {"name": f"tick-{i}"}})
        await _until(lambda r=received: ours.api.bytes_received > r, "a bookmark")  # type: ignore[misc]
        await asyncio.sleep(0.1)
    bookmark_bytes = (ours.api.bytes_received - start[1]) / rounds
    k.api.bookmark_interval = 60.0
    # Per node-hour.
    per_reopen = reopen_bytes / rounds
    before = (HOUR_S / OLD_RESYNC_S, HOUR_S / OLD_RESYNC_S * list_bytes)
    after = (
        HOUR_S / WATCH_REOPEN_S * reopen_requests / rounds,
        HOUR_S / WATCH_REOPEN_S * per_reopen + HOUR_S / BOOKMARK_S * bookmark_bytes,
    )
    print(
        f"steady state, {2 * rounds} syncs: {sync_requests} requests, {sync_bytes} bytes;"
        f" a LIST {list_bytes / 1024:.1f} KiB, a watch re-open {per_reopen:.0f} B, a bookmark"
        f" {bookmark_bytes:.0f} B"
    )
    print(f"per node-hour, LIST every 60 s (before): {before[0]:6.1f} requests {before[1] / 1024:9.1f} KiB")
    print(
        f"per node-hour, watch (after):            {after[0]:6.1f} requests {after[1] / 1024:9.1f} KiB"
        f"  x{before[0] / after[0]:.1f} fewer requests, x{before[1] / max(after[1], 1):.0f} fewer bytes"
    )
    fleet = 5000 / HOUR_S
    print(
        f"5,000 nodes: {before[0] * fleet:.1f} LIST/s, {before[1] * fleet / 2**20:.1f} MiB/s before;"
        f" {after[0] * fleet:.1f} watch re-opens/s, {after[1] * fleet / 1024:.1f} KiB/s after"
    )


@contextlib.asynccontextmanager
async def serving_driver(
    kubeconfig: str, work: Path, name: str, spec: DevicesSpec, host: HostRoot, *, cdi: Path | None = None
) -> AsyncIterator[tuple[DraDriver, DraApi, DraClient]]:
    """A driver with its own directories, registered with a kubelet stand-in, its slices published.
    `cdi`: where its CDI spec directory goes (default: beside the others, in `work`)."""
    config = DriverConfig(
        node_name=NODE,
        plugin_dir=f"{work}/{name}/p",
        registry_dir=f"{work}/{name}/r",
        cdi_dir=f"{cdi or work}/{name}/c",
    )
    api = DraApi(nodeclient.load(kubeconfig), config)  # the benchmark's own requests
    driver = DraDriver(
        config, RecordSource(spec), host, DraApi(nodeclient.load(kubeconfig), config), resync=3600
    )
    kubelet = DraKubelet(config.registry_dir)
    stop = asyncio.Event()
    task = asyncio.create_task(driver.run(stop))
    try:
        plugin = await kubelet.wait_registered(DRIVER)
        await _until(lambda: driver.publisher.syncs >= 1 and driver.publisher.watch.connects >= 1, "a sync")
        yield driver, api, plugin
    finally:
        await kubelet.stop()
        stop.set()
        await task


@contextlib.asynccontextmanager
async def api_process(work: Path, claims: int) -> AsyncIterator[str]:
    """The API served by a child process (`serve_api`); yields its kubeconfig."""
    directory = work / "api"
    directory.mkdir()
    child = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--serve-api", str(directory), "--claims", str(claims),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert child.stdin is not None and child.stdout is not None
    try:
        line = await asyncio.wait_for(child.stdout.readline(), 120)
        if not line:
            raise RuntimeError("the API process ended before serving")
        yield line.decode().strip()
    finally:
        child.stdin.close()
        try:
            await asyncio.wait_for(child.wait(), 30)
        except TimeoutError:
            child.kill()
            await child.wait()


async def main(args: argparse.Namespace) -> int:
    if args.serve_api:
        return await serve_api(args.serve_api, args.claims)
    work = Path(tempfile.mkdtemp(prefix="nfbdra", dir="/tmp"))
    # The CDI specs where a node keeps them: /var/run/cdi (the driver's default) is on a tmpfs (/run) on
    # every systemd host, while the checkpoint is under kubelet's plugin directory, on disk. On this disk
    # (ext4, shared with other work) a create waits behind whatever journal commit is writing the
    # directory's blocks: 8 us quiet, 0.2-1.5 ms behind another process's fsync.
    cdi = (
        None
        if args.cdi_on_disk or not os.path.isdir(SHM)
        else Path(tempfile.mkdtemp(prefix="nfbdra", dir=SHM))
    )
    where = (
        "on disk, beside the checkpoint" if cdi is None else f"on tmpfs ({SHM}, as /var/run/cdi on a node)"
    )
    try:
        b = scenarios.bench(work / "host", pfs=args.pfs, vfs=args.vfs)
        b.rdma_cm()
        # The first VF of the first PF (the bench tree's PFs are all partitioned) gets a verbs device.
        b.verbs("0000:11:00.1", f"mlx5_{args.pfs}", args.pfs)
        reading = inventory.read(b.host, libraries=Libraries(nvidia=NoNvidia(), ascend=NoAscend()))
        assert reading.interfaces is not None
        spec = reading.spec()
        # Prepare figures against an API in its own process (its handling off the driver's loop); the
        # steady-state and held figures read the API's own counters, so they run against one in process.
        async with (
            api_process(work, args.claims) as kubeconfig,
            serving_driver(kubeconfig, work, "prepare", spec, b.host, cdi=cdi) as (driver, api, plugin),
        ):
            slices, _ = await asyncio.to_thread(api.list_slices)
            devices = sum(len(s["spec"]["devices"]) for s in slices)
            print(
                f"pool: {args.pfs} PFs x {args.vfs} VFs: {devices} devices in {len(slices)} slices;"
                f" the checkpoint on disk, CDI specs {where}"
            )
            profiled = await bench_prepare(
                driver, api, plugin, claims=args.claims, rounds=args.rounds, profile=args.profile
            )
        async with running_api(directory=str(work)) as k:
            put_node(k)
            async with serving_driver(k.kubeconfig, work, "steady", spec, b.host, cdi=cdi) as (
                driver,
                api,
                plugin,
            ):
                await bench_steady(k, driver, api, max(5, args.claims // 20))
                await bench_held(
                    k, driver, plugin, DEVICE, held=args.held, rounds=max(5, args.claims // 10), work=work
                )
        for line in profiled:  # last, so the figures above keep their places
            print(line)
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if cdi is not None:
            shutil.rmtree(cdi, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument(
        "--rounds", type=int, default=3, help="passes over the claims; the target is judged on their median"
    )
    parser.add_argument("--pfs", type=int, default=8)
    parser.add_argument("--vfs", type=int, default=128)
    parser.add_argument(
        "--cdi-on-disk",
        action="store_true",
        help=f"CDI specs on disk, beside the checkpoint (default: on tmpfs, {SHM}, as on a node)",
    )
    parser.add_argument("--held", type=int, default=1500, help="claims held while a prepare is timed")
    parser.add_argument(
        "--profile",
        metavar="DIR",
        type=Path,
        help="after the rounds, two more passes over the claims: each first prepare's phases (p50), then"
        " cProfile of the loop's and the hop's threads (DIR/loop.prof, DIR/hop.prof), printed last",
    )
    parser.add_argument("--serve-api", metavar="DIR", help=argparse.SUPPRESS)  # the API's own process
    parsed: Any = parser.parse_args()
    if parsed.claims < 1 or parsed.rounds < 1:
        parser.error("--claims and --rounds must be at least 1")
    sys.exit(asyncio.run(main(parsed)))
