#!/usr/bin/env python3
"""The extender's peak memory when every pod of the cluster carries a large annotation.

Anyone who can create pods can make them big: up to 256 KiB of annotations each. The extender's cache
must hold only what placement reads, never an annotation value, and its LIST must be paged, so its peak
stays within the chart's memory limit (extender.resources.limits.memory) whatever pods carry. This runs
the real `nodefabric extender` process against the embedded API holding `--pods` pods (half of them in
8-pod groups, all pending) on `--nodes` nodes, with a `--annotation-kb` KB annotation on every pod (the
attack: a forged placement.gpustack.ai/decision), and prints the process's peak RSS (VmHWM) once its
caches are synced, against the same run with bare pods (the baseline) and the chart's limit.

Usage: hack/bench_extender_memory.py [--pods 10000] [--annotation-kb 250] [--nodes 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "operator"), str(ROOT / "devicemanager"), str(ROOT / "tests" / "extender")]

from extender_fixtures import explicit, node, pod  # noqa: E402

from nodefabric_operator.demo.kubeapi import running_api  # noqa: E402

NODEFABRIC = str(Path(sys.executable).parent / "nodefabric")


def chart_limit_mib() -> float:
    values = yaml.safe_load((ROOT / "charts" / "nodefabric" / "values.yaml").read_text())
    limit = str(values["extender"]["resources"]["limits"]["memory"])
    units = {"Mi": 1.0, "Gi": 1024.0}
    return float(limit[:-2]) * units[limit[-2:]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def measure(pods: int, nodes: int, annotation_kb: int) -> tuple[float, float]:
    """(seconds to a synced cache, peak RSS MiB) of one extender process."""
    blob = "x" * (annotation_kb * 1024)
    async with running_api() as k:
        for i in range(nodes):
            k.api.put_object("v1/nodes", node(f"gpu-{i:05d}", zone=f"z{i % 10}", region=f"r{i % 2}"))
        for i in range(pods):
            group: dict[str, Any] = explicit(f"g{i // 8}", 8) if i % 2 else {}
            p = pod(f"p-{i:05d}", gpus=1, **group)
            if blob:
                p["metadata"].setdefault("annotations", {})["placement.gpustack.ai/decision"] = blob
            k.api.put_object("v1/pods", p, validate=False)
        port, metrics = free_port(), free_port()
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "extender.log"
            with open(log, "wb") as out:
                proc = await asyncio.create_subprocess_exec(
                    NODEFABRIC, "extender", "--kubeconfig", k.kubeconfig, "--port", str(port),
                    "--metrics-port", str(metrics), "--metrics-address", "127.0.0.1",
                    stdout=out, stderr=out, env=dict(os.environ),
                )  # fmt: skip
            start = time.monotonic()
            try:
                async with aiohttp.ClientSession() as s:
                    while True:
                        if proc.returncode is not None:
                            raise RuntimeError(f"the extender exited: {log.read_text()[-2000:]}")
                        try:
                            async with s.get(f"http://127.0.0.1:{metrics}/readyz") as r:
                                if r.status == 200:
                                    break
                        except aiohttp.ClientError:
                            pass
                        await asyncio.sleep(0.2)
                synced = time.monotonic() - start
                await asyncio.sleep(1.0)  # the watches settle
                return synced, peak_mib(proc.pid)
            finally:
                proc.terminate()
                await proc.wait()


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--annotation-kb", type=int, default=250)
    a = parser.parse_args()
    limit = chart_limit_mib()
    base_s, base = await measure(a.pods, a.nodes, 0)
    big_s, big = await measure(a.pods, a.nodes, a.annotation_kb)
    head = f"extender peak RSS, {a.pods} pods on {a.nodes} nodes"
    print(f"{head} (VmHWM once synced; chart limit {limit:.0f} MiB)")
    print(f"  bare pods (baseline):          {base:7.1f} MiB  synced in {base_s:5.1f} s")
    print(f"  {a.annotation_kb} KB annotation per pod:    {big:7.1f} MiB  synced in {big_s:5.1f} s")
    print(f"  ratio to baseline: {big / base:.2f}x; {big / limit:.0%} of the chart's limit")
    if big > limit:
        print("  OVER the chart's memory limit")
        sys.exit(1)


if __name__ == "__main__":
    asyncio.run(main())
