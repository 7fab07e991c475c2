#!/usr/bin/env python3
"""Benchmark the group-locality extender: the decision in-process and over HTTP, against a floor.

Fleet per size: the seed's benchmark fleet (5 zones in 2 regions, half the nodes busy) scaled to N
nodes of 8 GPUs; every request is the FIRST pod of a new 8-pod group asking 4 GPUs, so each one
chooses a bucket over all N feasible nodes (the expensive path; later pods only follow the bucket).

Figures, median per decision:
- decide: placement.decide() over a prepared snapshot (what the seed's figures measure)
- service: Extender.filter() on parsed ExtenderArgs (group resolution, claims, answer building)
- http: POST /filter on 127.0.0.1 with the full Pod JSON and N NodeNames, answer read
- floor: an HTTP endpoint on the same server stack that only decodes the same payload and re-encodes it

Usage: hack/bench_extender.py [--sizes 30,120,500,5000] [--repeat N]
"""

from __future__ import annotations

import argparse
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
from nodefabric_operator.extender.cache import Cache, pod_requests  # noqa: E402
from nodefabric_operator.extender.config import ExtenderConfig  # noqa: E402
from nodefabric_operator.extender.server import make_app  # noqa: E402
from nodefabric_operator.extender.service import Extender  # noqa: E402
from nodefabric_operator.extender.wire import parse_args  # noqa: E402

SEED_US = {30: 60.0, 120: 210.0, 500: 925.0}
TARGET_5000_US = 9000.0
ZONES = [
    ("europe-west1-b", "europe-west1"),
    ("europe-west1-c", "europe-west1"),
    ("europe-west1-d", "europe-west1"),
    ("europe-west4-a", "europe-west4"),
    ("europe-west4-b", "europe-west4"),
]


def snapshot(n: int) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = []
    for i in range(n):
        zone, region = ZONES[i % len(ZONES)]
        name = f"gpu-{i:05d}"
        objs.append(node(name, zone=zone, region=region))
        if i % 2:
            objs.append(pod(f"busy-{i}", namespace="other", gpus=4, node_name=name, phase="Running"))
    return objs


def group_pod(i: int) -> dict[str, Any]:
    return pod(f"train{i}-0", gpus=4, **explicit(f"train{i}", 8))


def timed(fn: Any, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6


def in_process(n: int, repeat: int) -> tuple[float, float]:
    config = ExtenderConfig()
    cache = Cache(config)
    cache.load_objects(snapshot(n))
    names = tuple(sorted(cache.nodes))
    views = cache.views
    feasible = [views[x] for x in names]
    request, _ = pod_requests(group_pod(0))
    group = placement.GroupRequest(
        key="ml/explicit/train",
        size=8,
        remaining=8,
        locality="prefer",
        rank="spread",
        homogeneous_keys=config.homogeneous_keys,
        request=request,
    )
    d = placement.decide(group, feasible, views, config)
    assert d.outcome == "placed" and d.level == "zone", d.summary
    decide_us = timed(lambda: placement.decide(group, feasible, views, config), repeat)

    ext = Extender(config, cache)
    payloads = [parse_args(args(group_pod(i), names)) for i in range(repeat)]
    it = iter(payloads)
    service_us = timed(lambda: ext.filter(next(it)), repeat)
    return decide_us, service_us


async def _floor(request: web.Request) -> web.Response:
    body = json.loads(await request.read())
    return web.Response(body=json.dumps(body, separators=(",", ":")), content_type="application/json")


def _serve(n: int, port: int) -> None:
    apps = []
    for config in (ExtenderConfig(), ExtenderConfig(reasonsWhenPlaced=False)):
        cache = Cache(config)
        cache.load_objects(snapshot(n))
        apps.append(make_app(Extender(config, cache)))
    app, lean = apps
    app.add_subapp("/lean", lean)
    app.router.add_post("/floor", _floor)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def over_http(n: int, repeat: int) -> tuple[float, float, float]:
    port = _free_port()
    proc = multiprocessing.Process(target=_serve, args=(n, port), daemon=True)
    proc.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for _ in range(200):
            try:
                conn.request("GET", "/readyz")
                conn.getresponse().read()
                break
            except OSError:
                time.sleep(0.05)
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        names = [f"gpu-{i:05d}" for i in range(n)]
        bodies = [json.dumps(args(group_pod(i), names)).encode() for i in range(2 * repeat + 10)]
        headers = {"Content-Type": "application/json"}

        def post(path: str, body: bytes) -> None:
            conn.request("POST", path, body, headers)
            resp = conn.getresponse()
            data = resp.read()
            assert resp.status == 200, data[:200]

        paths = ("/filter", "/lean/filter", "/floor")
        for b in bodies[:5]:  # warm every path
            for path in paths:
                post(path, b)
        samples: dict[str, list[float]] = {p: [] for p in paths}
        for i in range(repeat):  # interleaved, so every path sees the same machine load
            b = bodies[10 + i]
            for path in paths:
                t = time.perf_counter()
                post(path, b)
                samples[path].append(time.perf_counter() - t)
        http_us, lean_us, floor_us = (statistics.median(samples[p]) * 1e6 for p in paths)
        return http_us, lean_us, floor_us
    finally:
        proc.terminate()
        proc.join()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="30,120,500,5000")
    parser.add_argument("--repeat", type=int, default=0, help="requests per figure (default: by size)")
    opts = parser.parse_args()
    sizes = [int(s) for s in opts.sizes.split(",")]
    print(
        f"{'nodes':>6} {'decide us':>10} {'seed us':>8} {'ratio':>6} {'service us':>11} "
        f"{'http us':>9} {'lean us':>8} {'floor us':>9} {'http/floor':>10} {'lean/floor':>10}"
    )
    ok = lean_ok = True
    for n in sizes:
        repeat = opts.repeat or (400 if n <= 500 else 60)
        decide_us, service_us = in_process(n, repeat)
        http_us, lean_us, floor_us = over_http(n, max(20, repeat // 4))
        seed = SEED_US.get(n, TARGET_5000_US if n == 5000 else float("nan"))
        ratio = decide_us / seed
        ok &= not ratio > 1.0
        lean_ok &= ok
        if n == 5000:
            ok &= http_us <= 2 * floor_us
            lean_ok &= lean_us <= 2 * floor_us
        print(
            f"{n:>6} {decide_us:>10.0f} {seed:>8.0f} {ratio:>6.2f} {service_us:>11.0f} "
            f"{http_us:>9.0f} {lean_us:>8.0f} {floor_us:>9.0f} {http_us / floor_us:>10.2f} "
            f"{lean_us / floor_us:>10.2f}"
        )
    print("http: default answer (a reason for every node turned away); lean: reasonsWhenPlaced=false")
    print(
        "targets: decide <= seed figure (60/210/925 us), <= 9000 us at 5000; http <= 2x floor at 5000:",
        "met" if ok else "NOT met",
        "| lean:",
        "met" if lean_ok else "NOT met",
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
