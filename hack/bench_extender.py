#!/usr/bin/env python3
"""Benchmark the group-locality extender: its decision in-process, and cold and warm answers over HTTP,
each against a baseline measured in the same run.

In-process (against the seed's figures): the seed's benchmark fleet (5 zones in 2 regions, half the
nodes busy) at 30, 120 and 500 nodes of 8 GPUs; every call is the first pod of a new 8-pod group asking
4 GPUs, so each chooses a bucket over every node. `decide` times placement.decide() on the cache.

Over HTTP, at 5,000 nodes: 50 zones of 100 nodes in 5 regions, 500 fabric domains of 10 nodes, every
other node running a 4-GPU pod; the group's pods ask 4 GPUs. Every request is POST /filter with the full
Pod JSON and all 5,000 NodeNames, the answer read whole:
- cold: the first pod of a NEW 64-pod group each time (choose a bucket, answer 5,000 nodes with reasons)
- warm: a later pod of one already-placed 64-pod group (follow its bucket)
- floor: an endpoint on the same server stack that only decodes the same request and re-encodes it
Paths are interleaved request by request so each sees the same machine load; figures are medians.
Answers carry a reason for every node turned away (`lean` shows reasonsWhenPlaced=false beside it).

Usage: hack/bench_extender.py [--sizes 30,120,500] [--nodes 5000] [--repeat N]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import multiprocessing
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "operator"), str(ROOT / "devicemanager"), str(ROOT / "tests" / "extender")]

from aiohttp import web  # noqa: E402
from extender_fixtures import args, explicit, node, pod  # noqa: E402

from nodefabric_operator.extender import placement  # noqa: E402
from nodefabric_operator.extender.cache import Cache  # noqa: E402
from nodefabric_operator.extender.config import ExtenderConfig  # noqa: E402
from nodefabric_operator.extender.pods import pod_needs  # noqa: E402
from nodefabric_operator.extender.server import make_app, runner  # noqa: E402
from nodefabric_operator.extender.service import Extender  # noqa: E402

SEED_US = {30: 60.0, 120: 210.0, 500: 925.0}
SEED_ZONES = [
    ("europe-west1-b", "europe-west1"),
    ("europe-west1-c", "europe-west1"),
    ("europe-west1-d", "europe-west1"),
    ("europe-west4-a", "europe-west4"),
    ("europe-west4-b", "europe-west4"),
]
FABRIC = "feature.gpustack.ai/fabric.domain"
GROUP = 64


def seed_fleet(n: int) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = []
    for i in range(n):
        zone, region = SEED_ZONES[i % len(SEED_ZONES)]
        name = f"gpu-{i:05d}"
        objs.append(node(name, zone=zone, region=region))
        if i % 2:
            objs.append(pod(f"busy-{i}", namespace="other", gpus=4, node_name=name, phase="Running"))
    return objs


def large_fleet(n: int) -> list[dict[str, Any]]:
    """n nodes: zones of 100 in regions of 10 zones, fabric domains of 10 inside a zone, half busy."""
    objs: list[dict[str, Any]] = []
    for i in range(n):
        name = f"gpu-{i:05d}"
        zone = i // 100
        objs.append(
            node(
                name,
                zone=f"zone-{zone:02d}",
                region=f"region-{zone // 10}",
                labels={FABRIC: f"nvl-{i // 10:03d}"},
            )
        )
        if i % 2:
            objs.append(pod(f"busy-{i}", namespace="other", gpus=4, node_name=name, phase="Running"))
    return objs


def group_pod(group: str, i: int, size: int) -> dict[str, Any]:
    return pod(f"{group}-{i}", gpus=4, **explicit(group, size))


def timed(fn: Any, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6


def decide_us(n: int, repeat: int) -> float:
    """placement.decide() for the first pod of a new group, on the cache of the seed's fleet."""
    config = ExtenderConfig()
    cache = Cache(config)
    cache.load_objects(seed_fleet(n))
    feasible = set(cache.nodes)
    p = group_pod("train", 0, 8)
    group = placement.GroupRequest(
        key="ml/explicit/train",
        size=8,
        remaining=8,
        locality="prefer",
        rank="spread",
        homogeneous_keys=config.homogeneity_for(pod_needs(p).extended),
        needs=pod_needs(p),
    )
    d = placement.decide(group, feasible, cache, config)
    assert d.outcome == "placed" and d.level == "zone", d.summary
    return timed(lambda: dict(placement.decide(group, feasible, cache, config).rejected), repeat)


async def _floor(request: web.Request) -> web.Response:
    body = json.loads(await request.read())
    return web.Response(body=json.dumps(body, separators=(",", ":")), content_type="application/json")


def _serve(n: int, port: int) -> None:
    apps = []
    for config in (ExtenderConfig(), ExtenderConfig(reasonsWhenPlaced=False)):
        cache = Cache(config)
        cache.load_objects(large_fleet(n))
        apps.append(make_app(Extender(config, cache)))
    app, lean = apps
    app.add_subapp("/lean", lean)
    app.router.add_post("/floor", _floor)

    async def serve() -> None:
        served = runner(app)  # the listener as the CLI runs it
        await served.setup()
        await web.TCPSite(served, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    asyncio.run(serve())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def over_http(n: int, repeat: int) -> dict[str, float]:
    port = _free_port()
    proc = multiprocessing.Process(target=_serve, args=(n, port), daemon=True)
    proc.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for _ in range(1200):
            try:
                conn.request("GET", "/readyz")
                conn.getresponse().read()
                break
            except OSError:
                time.sleep(0.05)
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        names = [f"gpu-{i:05d}" for i in range(n)]
        headers = {"Content-Type": "application/json"}

        def send(path: str, body: bytes) -> bytes:
            """One request, its answer read whole (what kube-scheduler waits for)."""
            conn.request("POST", path, body, headers)
            resp = conn.getresponse()
            data = resp.read()
            assert resp.status == 200, data[:200]
            return data

        def post(path: str, body: bytes) -> dict[str, Any]:
            out: dict[str, Any] = json.loads(send(path, body))
            return out

        def body(p: dict[str, Any]) -> bytes:
            return json.dumps(args(p, names)).encode()

        warm_size = repeat + 20
        for prefix in ("", "/lean"):  # the warm group's first pod places it
            first = post(f"{prefix}/filter", body(group_pod("warm", 0, warm_size)))
            assert first["NodeNames"], "the warm group was not placed"
        rounds = [
            {
                "cold": body(group_pod(f"cold{i}", 0, GROUP)),
                "warm": body(group_pod("warm", i + 1, warm_size)),
            }
            for i in range(repeat + 5)
        ]
        check = post("/filter", rounds[0]["cold"])
        assert len(check["NodeNames"]) == 100 and len(check["FailedNodes"]) == n - 100, "cold: not one zone"
        paths = {
            "cold": ("/filter", "cold"),
            "warm": ("/filter", "warm"),
            "lean cold": ("/lean/filter", "cold"),
            "floor": ("/floor", "cold"),
        }
        samples: dict[str, list[float]] = {k: [] for k in paths}
        for i, bodies in enumerate(rounds[1:]):
            for figure, (path, kind) in paths.items():
                payload = bodies[kind]
                if figure == "lean cold":
                    payload = payload.replace(b'"cold', b'"lean')  # a new group there too
                t = time.perf_counter()
                send(path, payload)
                if i >= 4:  # the first rounds warm every path up
                    samples[figure].append(time.perf_counter() - t)
        return {k: statistics.median(v) * 1e6 for k, v in samples.items()}
    finally:
        proc.terminate()
        proc.join()


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="30,120,500", help="fleet sizes for the in-process decision")
    parser.add_argument("--nodes", type=int, default=5000, help="fleet size over HTTP")
    parser.add_argument("--repeat", type=int, default=0, help="samples per figure (default: by size)")
    opts = parser.parse_args()
    ok = True
    print(f"{'nodes':>6} {'decide us':>10} {'seed us':>8} {'ratio':>6}")
    for n in (int(s) for s in opts.sizes.split(",")):
        us = decide_us(n, opts.repeat or 400)
        seed = SEED_US.get(n, float("nan"))
        ok &= not us / seed > 1.0
        print(f"{n:>6} {us:>10.0f} {seed:>8.0f} {us / seed:>6.2f}")
    got = over_http(opts.nodes, opts.repeat or 60)
    floor = got["floor"]
    print(f"\nover HTTP, {opts.nodes} nodes, all NodeNames in every request (median us, ratio to floor):")
    for figure in ("floor", "cold", "warm", "lean cold"):
        print(f"  {figure:>10} {got[figure]:>9.0f} us  {got[figure] / floor:>5.2f}x")
    cold_ok = got["cold"] <= 2 * floor
    ok &= cold_ok
    print(
        "targets: decide <= the seed's 60/210/925 us; cold <= 2x floor at 5000 nodes with full reasons:",
        "met" if ok else "NOT met",
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
