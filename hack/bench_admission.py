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

Usage: hack/bench_admission.py [--sizes 1000,5000] [--rounds 5]
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

from admission_world import GATE, NS, World, job, job_pods, node, placement  # noqa: E402

from nodefabric_operator.admission import model  # noqa: E402
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,5000")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"group admission: {GROUP}-pod groups of 8 GPUs a pod, medians of {args.rounds} rounds")
    print(f"{'nodes':>6}  {'last create -> gates removed':>30}  {'in-process decision':>20}  {'ratio':>7}")
    for n in (int(s) for s in args.sizes.split(",")):
        e2e_ms, decide_us = asyncio.run(run_size(n, args.rounds))
        ratio = e2e_ms * 1e3 / decide_us
        print(f"{n:>6}  {e2e_ms:>27.1f} ms  {decide_us / 1e3:>17.2f} ms  {ratio:>6.1f}x")


if __name__ == "__main__":
    main()
