"""Benchmark the DRA driver over real unix sockets and real HTTP, against baselines measured in the same run.

    python hack/bench_dra.py [--claims 200] [--pfs 8] [--vfs 128]

Figures:
- NodePrepareResources of one claim (one device): the first prepare (reads the ResourceClaim from the
  API, resolves the verbs device, writes the CDI spec and the checkpoint, both synced to disk), a repeated
  prepare (answered from the checkpoint), and NodeUnprepareResources, each against an empty
  NodeUnprepareResources call on the same channel (the gRPC floor) and, for the first prepare, against a
  bare GET of the claim (the API floor). Target: the first prepare adds at most 20 ms (p50) to the GET.
- A steady-state ResourceSlice sync of a large pool (`--pfs` PFs with `--vfs` VFs each): build the
  desired slices, read the link layers, list the live slices and compare, writing nothing; against a bare
  LIST of the same slices. The ratio is what deciding "nothing changed" costs beyond reading.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from nodefabric_devicemanager import inventory, nodeclient
from nodefabric_devicemanager.accelerators import Libraries
from nodefabric_devicemanager.accelerators.ascend import NoAscend
from nodefabric_devicemanager.accelerators.nvidia import NoNvidia
from nodefabric_devicemanager.testing import scenarios
from nodefabric_deviceplugin.dra.claims import ClaimRef
from nodefabric_deviceplugin.dra.config import DriverConfig
from nodefabric_deviceplugin.dra.driver import DraDriver
from nodefabric_deviceplugin.dra.kube import DraApi
from nodefabric_deviceplugin.source import RecordSource
from nodefabric_deviceplugin.testing.drakubelet import DraClient, DraKubelet
from nodefabric_operator.demo.dra import serve_dra_resources
from nodefabric_operator.demo.kubeapi import RunningAPI, running_api

NODE = "bench-0"
DRIVER = "rdma.gpustack.ai"


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(name: str, samples: list[float], baseline: list[float], floor: str) -> None:
    p50, p99 = percentile(samples, 0.5) * 1e3, percentile(samples, 0.99) * 1e3
    b50 = percentile(baseline, 0.5) * 1e3
    print(f"{name:<34} p50 {p50:8.3f} ms  p99 {p99:8.3f} ms  {floor} p50 {b50:7.3f} ms  x{p50 / b50:.1f}")


def declare(k: RunningAPI) -> None:
    serve_dra_resources(k)
    k.api.put_object("v1/nodes", {"metadata": {"name": NODE}})


def claim(k: RunningAPI, name: str, device: str) -> ClaimRef:
    uid = str(uuid.uuid4())
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


async def bench_prepare(k: RunningAPI, api: DraApi, plugin: DraClient, device: str, claims: int) -> None:
    """Each figure interleaved with its floor, claim by claim, so a machine shared with other work slows
    both alike."""
    refs = [claim(k, f"c{i}", device) for i in range(claims)]
    probe = claim(k, "probe", device)
    answer = (await plugin.prepare(probe))[probe.uid]
    assert answer.error == "", answer.error  # a failing prepare would time the wrong path
    await plugin.unprepare(probe)
    figures: dict[str, list[float]] = {n: [] for n in ("get", "empty", "first", "again", "gone")}
    for r in refs:
        figures["get"].append(await _time(lambda r=r: asyncio.to_thread(api.get_claim, r.namespace, r.name)))  # type: ignore[misc]
        figures["empty"].append(await _time(plugin.unprepare))
        figures["first"].append(await _time(lambda r=r: plugin.prepare(r)))  # type: ignore[misc]
        figures["again"].append(await _time(lambda r=r: plugin.prepare(r)))  # type: ignore[misc]
        figures["gone"].append(await _time(lambda r=r: plugin.unprepare(r)))  # type: ignore[misc]
    report("prepare, first (API + spec + fsync)", figures["first"], figures["get"], "claim GET")
    report("prepare, first", figures["first"], figures["empty"], "empty call")
    report("prepare, again (checkpoint)", figures["again"], figures["empty"], "empty call")
    report("unprepare (spec + fsync)", figures["gone"], figures["empty"], "empty call")
    added = percentile(figures["first"], 0.5) - percentile(figures["get"], 0.5)
    print(f"target: the first prepare adds <= 20 ms to the claim GET (p50 adds {added * 1e3:.1f} ms)")


async def bench_sync(driver: DraDriver, api: DraApi, rounds: int) -> None:
    syncs: list[float] = []
    lists: list[float] = []
    for _ in range(rounds):
        start = time.perf_counter()
        decided = await asyncio.to_thread(driver.publisher.sync)
        syncs.append(time.perf_counter() - start)
        assert decided is not None and decided.writes == 0
        start = time.perf_counter()
        await asyncio.to_thread(api.list_slices)
        lists.append(time.perf_counter() - start)
    report("slice sync, nothing changed", syncs, lists, "bare LIST")


async def main(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="nfbdra", dir="/tmp"))
    try:
        b = scenarios.bench(work / "host", pfs=args.pfs, vfs=args.vfs)
        b.rdma_cm()
        # The first VF of the first PF (the bench tree's PFs are all partitioned) gets a verbs device.
        b.verbs("0000:11:00.1", f"mlx5_{args.pfs}", args.pfs)
        reading = inventory.read(b.host, libraries=Libraries(nvidia=NoNvidia(), ascend=NoAscend()))
        assert reading.interfaces is not None
        config = DriverConfig(
            node_name=NODE, plugin_dir=f"{work}/p", registry_dir=f"{work}/r", cdi_dir=f"{work}/c"
        )
        async with running_api(directory=str(work)) as k:
            declare(k)
            api = DraApi(nodeclient.load(k.kubeconfig), config)
            driver = DraDriver(config, RecordSource(reading.spec()), b.host, api, resync=3600)
            kubelet = DraKubelet(config.registry_dir)
            stop = asyncio.Event()
            task = asyncio.create_task(driver.run(stop))
            try:
                plugin = await kubelet.wait_registered(DRIVER)
                while driver.publisher.syncs < 1:
                    await asyncio.sleep(0.05)
                slices = await asyncio.to_thread(api.list_slices)
                devices = sum(len(s["spec"]["devices"]) for s in slices)
                print(f"pool: {args.pfs} PFs x {args.vfs} VFs: {devices} devices in {len(slices)} slices")
                device = "pci-0000-11-00-1"
                await bench_prepare(k, api, plugin, device, args.claims)
                await bench_sync(driver, api, max(5, args.claims // 20))
            finally:
                await kubelet.stop()
                stop.set()
                await task
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--pfs", type=int, default=8)
    parser.add_argument("--vfs", type=int, default=128)
    parsed: Any = parser.parse_args()
    sys.exit(asyncio.run(main(parsed)))
