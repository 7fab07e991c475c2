#!/usr/bin/env python3
"""Benchmark the group-locality extender: its decision in-process, and cold and warm answers over HTTP,
each against a baseline measured in the same run.

In-process (against the seed's figures): the seed's benchmark fleet (5 zones in 2 regions, half the
nodes busy) at 30, 120 and 500 nodes of 8 GPUs; every call is the first pod of a new 8-pod group asking
4 GPUs, so each chooses a bucket over every node. `decide` times placement.decide() on the cache.

Over HTTP, at 1,000, 5,000 and 20,000 nodes: zones of 100 nodes in regions of 10 zones, fabric
domains of 10 nodes, every other node running a 4-GPU pod, and two GPU products (zones alternate between
them: a fleet that grew a zone at a time; `--mixed domain` alternates fabric domains instead, so no zone
has room for 64 pods of one product among its free nodes and the rank-order walk crosses the fleet); the
group's pods ask 4 GPUs. Every request is POST /filter
with the full Pod JSON and all NodeNames, the answer read whole:
- cold: the first pod of a NEW group each time (choose a bucket, answer every node with reasons)
- warm: a later pod of one already-placed group (follow its bucket)
each for groups of 8 (a fabric domain) and 64 (a zone's nodes of one product);
- lean cold: the 64-pod cold request with reasonsWhenPlaced=false (allowed nodes only);
- floor: an endpoint on the same server stack that decodes the same request and encodes an answer of
  the extender's own size and shape (the cold or warm answer of that group size, as a JSON document).
Paths are interleaved request by request so each sees the same machine load; figures are medians, each
against its own floor. Target: every full-reasons figure <= 1.25x its floor.

Usage: hack/bench_extender.py [--sizes 30,120,500] [--nodes 1000,5000,20000] [--repeat N]
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
GROUPS = (8, 64)
PRODUCTS = ("NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB")
TARGET = 1.25


def seed_fleet(n: int) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = []
    for i in range(n):
        zone, region = SEED_ZONES[i % len(SEED_ZONES)]
        name = f"gpu-{i:05d}"
        objs.append(node(name, zone=zone, region=region))
        if i % 2:
            objs.append(pod(f"busy-{i}", namespace="other", gpus=4, node_name=name, phase="Running"))
    return objs


def large_fleet(n: int, mixed: str = "zone") -> list[dict[str, Any]]:
    """n nodes: zones of 100 in regions of 10 zones, fabric domains of 10 inside a zone, half busy, two
    GPU products alternating by zone (or by fabric domain)."""
    objs: list[dict[str, Any]] = []
    for i in range(n):
        name = f"gpu-{i:05d}"
        zone = i // 100
        objs.append(
            node(
                name,
                zone=f"zone-{zone:03d}",
                region=f"region-{zone // 10}",
                product=PRODUCTS[(zone if mixed == "zone" else i // 10) % 2],
                labels={FABRIC: f"nvl-{i // 10:04d}"},
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


_FLOOR_ANSWERS: dict[str, Any] = {}


async def _prime(request: web.Request) -> web.Response:
    """Keep an answer of the extender's (a JSON document) for the floor to encode."""
    _FLOOR_ANSWERS[request.match_info["kind"]] = json.loads(await request.read())
    return web.Response(text="ok")


async def _floor(request: web.Request) -> web.Response:
    """The floor: decode the request, encode an answer of the extender's own size and shape."""
    json.loads(await request.read())
    answer = _FLOOR_ANSWERS[request.match_info["kind"]]
    return web.Response(
        body=json.dumps(answer, separators=(",", ":")).encode(), content_type="application/json"
    )


def _serve(n: int, port: int, mixed: str) -> None:
    apps = []
    for config in (ExtenderConfig(), ExtenderConfig(reasonsWhenPlaced=False)):
        cache = Cache(config)
        cache.load_objects(large_fleet(n, mixed))
        apps.append(make_app(Extender(config, cache)))
    app, lean = apps
    app.add_subapp("/lean", lean)
    app.router.add_post("/floor/{kind}", _floor)
    app.router.add_post("/prime/{kind}", _prime)

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


def _connect(port: int) -> http.client.HTTPConnection:
    """A connection to the server once it answers (loading 20,000 nodes takes a while)."""
    for _ in range(2400):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            conn.request("GET", "/readyz")
            conn.getresponse().read()
            return conn
        except OSError:
            time.sleep(0.05)
    raise SystemExit("the benchmark server did not come up")


def over_http(n: int, repeat: int, mixed: str) -> dict[str, float]:
    port = _free_port()
    proc = multiprocessing.Process(target=_serve, args=(n, port, mixed), daemon=True)
    proc.start()
    try:
        conn = _connect(port)
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

        warm_size = {g: max(g, repeat + 20) for g in GROUPS}  # room for every warm pod of the run
        for g in GROUPS:
            for prefix in ("", "/lean"):  # the warm group's first pod places it
                first = post(f"{prefix}/filter", body(group_pod(f"warm{g}", 0, warm_size[g])))
                assert first["NodeNames"], "the warm group was not placed"
        rounds = [
            {
                **{f"cold {g}": body(group_pod(f"cold{g}x{i}", 0, g)) for g in GROUPS},
                **{f"warm {g}": body(group_pod(f"warm{g}", i + 1, warm_size[g])) for g in GROUPS},
            }
            for i in range(repeat + 5)
        ]
        # The floors encode the extender's own answers: kept from one request of each kind.
        for kind, payload in rounds[0].items():
            answer = send("/filter", payload)
            doc = json.loads(answer)
            assert len(doc["NodeNames"]) + len(doc["FailedNodes"]) == n, kind
            send(f"/prime/{kind.replace(' ', '-')}", answer)
        cold = json.loads(send("/filter", rounds[0]["cold 64"].replace(b'"cold', b'"check')))
        share = 100 if mixed == "zone" else 50
        assert len(cold["NodeNames"]) == share, "cold 64: not one zone's nodes of one product"
        assert any("gpu.product" in r for r in cold["FailedNodes"].values()), "no product reason"
        paths: dict[str, tuple[str, str]] = {}
        for g in GROUPS:
            for kind in ("cold", "warm"):
                paths[f"{kind} {g}"] = ("/filter", f"{kind} {g}")
                paths[f"floor {kind} {g}"] = (f"/floor/{kind}-{g}", f"{kind} {g}")
        paths["lean cold 64"] = ("/lean/filter", "cold 64")
        samples: dict[str, list[float]] = {k: [] for k in paths}
        for i, bodies in enumerate(rounds[1:]):
            for figure, (path, kind) in paths.items():
                payload = bodies[kind]
                if figure.startswith("lean"):
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
    parser.add_argument("--nodes", default="1000,5000,20000", help="fleet sizes over HTTP")
    parser.add_argument(
        "--mixed", choices=("zone", "domain"), default="zone", help="what alternates products"
    )
    parser.add_argument("--repeat", type=int, default=0, help="samples per figure (default: by size)")
    opts = parser.parse_args()
    ok = True
    print(f"{'nodes':>6} {'decide us':>10} {'seed us':>8} {'ratio':>6}")
    for n in (int(s) for s in opts.sizes.split(",")):
        us = decide_us(n, opts.repeat or 400)
        seed = SEED_US.get(n, float("nan"))
        ok &= not us / seed > 1.0
        print(f"{n:>6} {us:>10.0f} {seed:>8.0f} {us / seed:>6.2f}")
    print("\nover HTTP, two GPU products, all NodeNames in every request (median us; ratio to its floor):")
    print(f"{'nodes':>6} {'figure':>14} {'us':>9} {'floor us':>9} {'ratio':>6}")
    http_ok = True
    for n in (int(s) for s in opts.nodes.split(",")):
        got = over_http(n, opts.repeat or max(15, 200_000 // n), opts.mixed)
        for g in GROUPS:
            for kind in ("cold", "warm"):
                us, floor = got[f"{kind} {g}"], got[f"floor {kind} {g}"]
                http_ok &= us <= TARGET * floor
                print(f"{n:>6} {kind + ' ' + str(g):>14} {us:>9.0f} {floor:>9.0f} {us / floor:>5.2f}x")
        us, floor = got["lean cold 64"], got["floor cold 64"]
        print(f"{n:>6} {'lean cold 64':>14} {us:>9.0f} {floor:>9.0f} {us / floor:>5.2f}x")
    ok &= http_ok
    print(
        f"targets: decide <= the seed's 60/210/925 us; every full-reasons figure <= {TARGET}x its floor:",
        "met" if ok else "NOT met",
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
