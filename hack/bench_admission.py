#!/usr/bin/env python3
"""Benchmark group admission: the time from a group's last member's creation to the removal of its gates,
through the real placement controller against the embedded API over HTTP, at 1,000 and 5,000 nodes.

The baseline, measured in the same run on the same fleet: the in-process admission decision
(admission.admit.admit over the controller's own cache), which the end-to-end figure includes besides the
watch delivering the pod, the PlacementGroup status write, and one pin and one ungate patch per pod.

Fleet: zones of 100 nodes of 8 GPUs, 5 zones a region; every other node runs a 4-GPU pod. Each round is a
new 8-pod Job asking 8 GPUs a pod, its pods created one after another; the clock starts when the last
create returns and stops when the last gate is gone. After each round the group's pods are deleted, so
every round sees the same free capacity. Figures are medians.

Many waiting groups under churn (--waiting): the work each reconcile pass does, under the former rule (a
waiting group decided again after any watch event) and the current one (only when its pods, the capacity
it could use or its owner's count changed), side by side on the same seeded churn with passes run one at
a time (tests/admission/churn_driver.py): a full fleet, N complete groups of 4 that wait for room, and
passes after events of which one in ten frees a node (every waiting group decided again, under both
rules), one in ten takes it back, and the rest concern no waiting group (a pod of no group relabelled, a
foreign pod bound straight to a node, the first pod of a new group). Figures are per pass, means over the
churn passes (the groups' first decisions excluded).

Usage: hack/bench_admission.py [--sizes 1000,5000] [--rounds 5] [--waiting 200,400] [--passes 60]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "operator"), str(ROOT / "devicemanager"), str(ROOT / "tests" / "admission")]

from admission_world import GATE, NS, World, gpod, job, job_pods, jobs_world, node, placement  # noqa: E402
from admission_world import fleet as zone_fleet  # noqa: E402
from churn_driver import Driver, bystander, driven, group_pod  # noqa: E402

from nodefabric_operator.admission import controller, model  # noqa: E402
from nodefabric_operator.admission.admit import Member, admit  # noqa: E402
from nodefabric_operator.admission.owners import Size  # noqa: E402
from nodefabric_operator.demo.kubeapi import running_api  # noqa: E402
from nodefabric_operator.extender.config import ExtenderConfig  # noqa: E402
from nodefabric_operator.extender.groups import group_of  # noqa: E402
from nodefabric_operator.extender.pods import pod_needs  # noqa: E402

GROUP = 8


def fleet(n: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    nodes, busy = [], []
    for i in range(n):
        zone = f"r{i // 500}-z{i // 100}"
        nodes.append(node(f"n{i:05d}", zone))
        if i % 2:
            p = job_pods("busy", 1, gpus=4, gated=False)[0]
            p["metadata"]["name"] = f"busy-{i}"
            p["metadata"]["uid"] = f"busy-{i}"
            p["metadata"]["labels"] = {}
            p["spec"]["nodeName"] = nodes[-1]["metadata"]["name"]
            p["status"] = {"phase": "Running"}
            busy.append(p)
    return nodes, busy


def decision_us(ctl: Any, cfg: ExtenderConfig, rounds: int) -> float:
    pods = job_pods("probe", GROUP)
    spec = group_of(pods[0], cfg)
    assert spec is not None
    members = [Member(p["metadata"]["name"], p["metadata"]["name"], pod_needs(p), True) for p in pods]
    times = []
    for _ in range(max(5, rounds)):
        started = time.perf_counter()
        verdict = admit(spec, Size(GROUP, "bench"), members, ctl.cache, cfg)
        times.append(time.perf_counter() - started)
        assert verdict.outcome == "admitted", verdict.reason
    return statistics.median(times) * 1e6


async def run_size(n: int, rounds: int) -> tuple[float, float]:
    cfg = ExtenderConfig()
    nodes, busy = fleet(n)
    async with running_api([model.placement_crd()], history=100) as k:
        w = World(k)
        k.api.declare("batch/v1/jobs", kind="Job", namespaced=True)
        for obj in nodes:
            k.api.put_object("v1/nodes", obj)
        for obj in busy:
            k.api.put_object("v1/pods", obj)
        async with placement(k, cfg) as ctl:
            await asyncio.sleep(0.5)
            e2e = []
            for r in range(rounds):
                name = f"j{r}"
                await w.create(job(name, GROUP))
                pods = w.job_pods(name, GROUP)
                for p in pods:
                    await w.create(p)
                started = time.perf_counter()
                while any(GATE in w.gates(p["metadata"]["name"]) for p in pods):
                    await asyncio.sleep(0.002)
                e2e.append(time.perf_counter() - started)
                for p in pods:
                    await w.delete(p["metadata"]["name"])
                while any(p["metadata"]["name"] in w.pods() for p in pods) or ctl.tables.held:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.05)
            assert all(w.status(f"{NS}/job/j{r}")["phase"] == "Admitted" for r in range(rounds))
            decide = decision_us(ctl, cfg, rounds)
    return statistics.median(e2e) * 1e3, decide


DECIDING = [0.0]  # seconds spent in the admission rule, all passes together


def timed_admit(*args: Any, **kw: Any) -> Any:
    started = time.perf_counter()
    try:
        return admit(*args, **kw)
    finally:
        DECIDING[0] += time.perf_counter() - started


async def waiting_churn(d: Driver, groups: int, passes: int) -> tuple[tuple[float, float, float], list[Any]]:
    """Per churn pass, means: admission rules run, milliseconds in them, milliseconds of the whole pass;
    and the outcome after each pass."""
    nodes = sorted(d.ctl.cache.nodes)
    for i, name in enumerate(nodes):  # the fleet full: every group waits for room
        busy = gpod(f"busy-{i}", gated=False, scheduler="foreign")
        busy["spec"]["nodeName"] = name
        d.put_pod(busy)
    for g in range(groups):
        for i in range(4):
            d.put_pod(group_pod(f"w{g:04d}", i, 4))
    d.put_pod(bystander("bystander", "0"))
    await d.step()
    await d.step()
    first, deciding = len(d.passes), DECIDING[0]
    trace = []
    for p in range(passes):
        kind = p % 10
        if kind == 0:
            d.remove_pod(f"busy-{p % len(nodes)}")  # a node freed: room for one pod, no group fits
        elif kind == 1:
            busy = gpod(f"busy-{(p - 1) % len(nodes)}", gated=False, scheduler="foreign")
            busy["spec"]["nodeName"] = nodes[(p - 1) % len(nodes)]
            d.put_pod(busy)
        elif kind in (2, 3, 4):
            pod = bystander("bystander", str(p))
            d.k.api.put_object("v1/pods", pod)
        elif kind in (5, 6):
            d.put_pod(group_pod(f"late{p:04d}", 0, 2))
        else:
            extra = gpod(f"foreign-{p}", gated=False, gpus=1, scheduler="foreign")
            extra["spec"]["nodeName"] = nodes[p % len(nodes)]
            d.put_pod(extra)
        await d.step()
        trace.append(d.outcome())
    churn = d.passes[first:]
    decisions = statistics.mean(x.decisions for x in churn)
    deciding_ms = (DECIDING[0] - deciding) / len(churn) * 1e3
    return (decisions, deciding_ms, statistics.mean(x.seconds for x in churn) * 1e3), trace


async def run_waiting(groups: int, passes: int) -> dict[bool, tuple[float, float, float]]:
    out = {}
    traces = {}
    controller.admit = timed_admit  # type: ignore[attr-defined]
    for every_event in (True, False):
        nodes = zone_fleet(zones=("eu-a", "eu-b", "eu-c", "eu-d"), per_zone=25)
        async with jobs_world(*nodes) as (k, w), driven(k, w, every_event=every_event) as d:
            out[every_event], traces[every_event] = await waiting_churn(d, groups, passes)
    controller.admit = admit  # type: ignore[attr-defined]
    assert traces[True] == traces[False], "the two rules decided differently"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,5000")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--waiting", default="200,400", help="waiting groups, comma-separated; '' skips")
    parser.add_argument("--passes", type=int, default=60)
    args = parser.parse_args()
    if args.waiting:
        print(f"waiting groups under churn: 100 full nodes, groups of 4, means of {args.passes} passes")
        print("(before: decided again after any event; after: only on a change of theirs. The pass's wall")
        print(" time includes the embedded API serving its writes, in the same process.)")
        head = ("groups", "decisions/pass", "deciding ms/pass", "pass wall ms")
        print(f"{head[0]:>6}  {head[1]:>22}  {head[2]:>22}  {head[3]:>22}")
        print(f"{'':>6}  " + "  ".join(f"{'before':>10}  {'after':>10}" for _ in head[1:]))
        for n in (int(s) for s in args.waiting.split(",")):
            res = asyncio.run(run_waiting(n, args.passes))
            old, new = res[True], res[False]
            print(f"{n:>6}  " + "  ".join(f"{a:>10.1f}  {b:>10.1f}" for a, b in zip(old, new, strict=True)))
    if not args.sizes:
        return
    print(f"group admission: {GROUP}-pod groups of 8 GPUs a pod, medians of {args.rounds} rounds")
    print(f"{'nodes':>6}  {'last create -> gates removed':>30}  {'in-process decision':>20}  {'ratio':>7}")
    for n in (int(s) for s in args.sizes.split(",")):
        e2e_ms, decide_us = asyncio.run(run_size(n, args.rounds))
        ratio = e2e_ms * 1e3 / decide_us
        print(f"{n:>6}  {e2e_ms:>27.1f} ms  {decide_us / 1e3:>17.2f} ms  {ratio:>6.1f}x")


if __name__ == "__main__":
    main()
