#!/usr/bin/env python3
"""Benchmark the embedded Kubernetes API at fleet scale, against kmock's emulator as it is (same run).

Both serve the same requests over real HTTP on 127.0.0.1: create N Nodes and N Devices records (each
Devices owned by its Node, 8 interfaces), GET every record, merge-PATCH every record's status, LIST all
records and a label-selected 1% of the Nodes, and deliver watch events for 1,000 status patches.

Figures are the emulator's own time per request, measured inside its HTTP handler (the client's time
is left out), so the comparison is the emulators', not the client's:
- kmock: kmock.KubernetesEmulator as the project used it before, resources declared. It matches every
  request against its whole request history and scans every object, so its cost per request grows
  with every request served; it runs at a quarter of --baseline-records and at --baseline-records
  (200 by default: a 1,000-record run takes the better part of an hour), which shows the growth. ours
  runs at --baseline-records too (the ratio) and at --records.
- ours: nodefabric's KubeAPI (indexed store, bounded history), with the Devices CRD: it also validates
  every write against the CRD's schema, as an API server does; run at both sizes.
- watch: time from the first of 1,000 status PATCHes to the watcher holding all 1,000 events, per event.

Usage: hack/bench_kubeapi.py [--records 5000] [--baseline-records 200] [--concurrency 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "operator"), str(ROOT / "devicemanager")]

import aiohttp  # noqa: E402
import attrs  # noqa: E402
import kmock  # noqa: E402

from nodefabric_devicemanager import crd  # noqa: E402
from nodefabric_operator.demo.kubeapi import KubeAPI  # noqa: E402

DEVICES = "/apis/worker.gpustack.ai/v1alpha1/devices"
NODES = "/api/v1/nodes"
MERGE = {"Content-Type": "application/merge-patch+json"}
WATCHED = 1000


class Timer:
    """Handler time per request, by phase; watch requests (open for their whole life) left out."""

    def __init__(self) -> None:
        self.phase = ""
        self.samples: dict[str, list[float]] = {}

    async def timed(self, raw: Any, handle: Callable[[Any], Awaitable[Any]]) -> Any:
        if raw.query.get("watch") in ("true", "1"):
            return await handle(raw)
        start = time.perf_counter()
        try:
            return await handle(raw)
        finally:
            self.samples.setdefault(self.phase, []).append(time.perf_counter() - start)


@attrs.define(kw_only=True)
class TimedKmock(kmock.KubernetesEmulator):  # type: ignore[misc]
    timer: Timer

    async def __call__(self, raw: Any) -> Any:
        return await self.timer.timed(raw, super().__call__)


@attrs.define(kw_only=True)
class TimedKubeAPI(KubeAPI):
    timer: Timer

    async def __call__(self, raw: Any) -> Any:
        return await self.timer.timed(raw, super().__call__)


def node(i: int) -> dict[str, Any]:
    labels = {"topology.kubernetes.io/zone": f"zone-{i % 5}"}
    if i % 100 == 0:
        labels["feature.gpustack.ai/rdma.capable"] = "true"
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"gpu-{i:05d}", "labels": labels}}


def devices(i: int, node_uid: str) -> dict[str, Any]:
    owner = {"apiVersion": "v1", "kind": "Node", "name": f"gpu-{i:05d}", "uid": node_uid}
    interfaces = [
        {
            "name": f"ibp{n}s0",
            "bus": "pci",
            "pciBusId": f"0000:{0x18 + n * 16:02x}:00.0",
            "pciRootId": f"pci0000:{n * 16:02x}",
            "pciSwitches": [f"0000:{0x17 + n * 16:02x}:00.0"],
            "pciVendor": "15b3",
            "pciDevice": "1021",
            "numaAffinity": str(n // 4),
            "mtu": 4096,
            "up": True,
            "rdma": True,
            "rdmaDevice": f"mlx5_{n}",
            "link": {"state": "ok"},
        }
        for n in range(8)
    ]
    return {
        "apiVersion": "worker.gpustack.ai/v1alpha1",
        "kind": "Devices",
        "metadata": {"name": f"gpu-{i:05d}", "ownerReferences": [owner]},
        "spec": {"interfaces": interfaces},
    }


async def in_parallel(jobs: Iterable[Callable[[], Awaitable[Any]]], concurrency: int) -> list[Any]:
    gate = asyncio.Semaphore(concurrency)

    async def run(job: Callable[[], Awaitable[Any]]) -> Any:
        async with gate:
            return await job()

    return await asyncio.gather(*(run(job) for job in jobs))


async def request(http: aiohttp.ClientSession, method: str, url: str, body: Any = None, **kw: Any) -> Any:
    data = None if body is None else json.dumps(body)
    headers = kw.pop("headers", {"Content-Type": "application/json"})
    async with http.request(method, url, data=data, headers=headers, **kw) as resp:
        payload = await resp.read()
        if resp.status >= 400:
            raise RuntimeError(f"{method} {url}: HTTP {resp.status}: {payload[:300]!r}")
        return json.loads(payload)


def patch_status(http: aiohttp.ClientSession, base: str, i: int, rdma: int) -> Callable[[], Awaitable[Any]]:
    body = {"status": {"rdmaEndpoints": rdma}}
    url = f"{base}{DEVICES}/gpu-{i:05d}/status"
    return lambda: request(http, "PATCH", url, body, headers=MERGE)


async def watch_events(http: aiohttp.ClientSession, url: str, wanted: int, started: asyncio.Event) -> float:
    """Read a watch until `wanted` MODIFIED events arrived; the time from the first PATCH to the last."""
    seen = 0
    async with http.get(url, timeout=aiohttp.ClientTimeout(total=None)) as resp:
        started.set()
        async for line in resp.content:
            if json.loads(line)["type"] == "MODIFIED":
                seen += 1
                if seen == 1:
                    first = time.perf_counter()
                if seen == wanted:
                    return time.perf_counter() - first
    raise RuntimeError("the watch ended early")


async def workload(api: Any, timer: Timer, records: int, concurrency: int, our_rv: bool) -> None:
    async with kmock.Server(api) as server, aiohttp.ClientSession() as http:
        base = str(server.url).rstrip("/")
        timer.phase = "create-node"
        created = await in_parallel(
            [lambda i=i: request(http, "POST", base + NODES, node(i)) for i in range(records)], concurrency
        )
        uids = [n.get("metadata", {}).get("uid") or f"uid-{i}" for i, n in enumerate(created)]
        timer.phase = "create"
        await in_parallel(
            [lambda i=i: request(http, "POST", base + DEVICES, devices(i, uids[i])) for i in range(records)],
            concurrency,
        )
        timer.phase = "get"
        await in_parallel(
            [lambda i=i: request(http, "GET", f"{base}{DEVICES}/gpu-{i:05d}") for i in range(records)],
            concurrency,
        )
        timer.phase = "patch"
        await in_parallel([patch_status(http, base, i, 8) for i in range(records)], concurrency)
        timer.phase = "list"
        for _ in range(3):
            await request(http, "GET", base + DEVICES)
        timer.phase = "select"
        for _ in range(3):
            await request(
                http, "GET", base + NODES + "?labelSelector=feature.gpustack.ai/rdma.capable%3Dtrue"
            )
        timer.phase = "watch-patch"
        rv = (await request(http, "GET", base + DEVICES + "?limit=1"))["metadata"].get("resourceVersion", "")
        url = f"{base}{DEVICES}?watch=true" + (f"&resourceVersion={rv}" if our_rv else "")
        started = asyncio.Event()
        watcher = asyncio.create_task(watch_events(http, url, min(WATCHED, records), started))
        await started.wait()
        await asyncio.sleep(0.2)
        patches = [patch_status(http, base, i, 6) for i in range(min(WATCHED, records))]
        await in_parallel(patches, concurrency)
        timer.samples["watch"] = [await asyncio.wait_for(watcher, 600) / min(WATCHED, records)]


def kmock_api(timer: Timer) -> Any:
    api = TimedKmock(timer=timer)
    api.resources["v1/nodes"] = kmock.ResourceInfo(
        kind="Node", namespaced=False, verbs={"get", "list", "watch"}
    )
    api.resources["worker.gpustack.ai/v1alpha1/devices"] = kmock.ResourceInfo(
        kind="Devices", namespaced=False
    )
    return api


async def measure(kind: str, records: int, concurrency: int) -> tuple[Timer, float]:
    timer = Timer()
    if kind == "kmock":
        api = kmock_api(timer)
    else:
        api = TimedKubeAPI(timer=timer)
        api.declare_crd(crd.devices_crd())
    start = time.perf_counter()
    async with api:
        await workload(api, timer, records, concurrency, our_rv=kind == "ours")
    return timer, time.perf_counter() - start


def us(samples: list[float]) -> str:
    return f"{statistics.fmean(samples) * 1e6:10.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--baseline-records", type=int, default=200, help="kmock's size (default 200)")
    parser.add_argument("--concurrency", type=int, default=1, help="requests in flight (default: one)")
    args = parser.parse_args()
    small, large = args.baseline_records, args.records

    if not 4 <= small <= large:
        parser.error("--baseline-records must be between 4 and --records")
    sizes = [("kmock", small // 4), ("kmock", small), ("ours", small), ("ours", large)]
    runs = [(f"{kind}@{n}", *asyncio.run(measure(kind, n, args.concurrency))) for kind, n in sizes]

    print("embedded API: Nodes + Devices records; emulator time per request, us (mean)")
    print(
        f"{'phase':28}"
        + "".join(f"{label:>12}" for label, _, _ in runs[:3])
        + f"{'ratio':>8}{runs[3][0]:>12}"
    )
    rows = [
        ("create Node (POST)", "create-node"),
        ("create Devices (POST)", "create"),
        ("get record (GET)", "get"),
        ("status patch (PATCH)", "patch"),
        ("list every record", "list"),
        ("list nodes -l, 1% match", "select"),
        ("watch, per event delivered", "watch"),
    ]
    for label, phase in rows:
        kmock_few, kmock_many, ours_many, ours_fleet = (timer.samples[phase] for _, timer, _ in runs)
        ratio = statistics.fmean(kmock_many) / statistics.fmean(ours_many)
        cells = "".join(f"{us(samples):>12}" for samples in (kmock_few, kmock_many, ours_many))
        print(f"{label:28}{cells}{ratio:>7.1f}x{us(ours_fleet):>12}")
    print("ratio: kmock's time over ours at the same size; kmock's own cost grows with each request served")
    print("whole runs: " + ", ".join(f"{label} {wall:.1f} s" for label, _, wall in runs))
    label, fleet, _ = runs[3]
    requests = sum(len(v) for v in fleet.samples.values())
    busy = sum(sum(v) for v in fleet.samples.values())
    print(f"{label}: {busy:.1f} s of emulator time for {requests:,} requests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
