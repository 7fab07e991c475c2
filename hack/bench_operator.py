#!/usr/bin/env python3
"""Benchmark the label operator against the embedded API: what a fleet costs the API server and the pod.

The operator runs as its own process (`nodefabric operator`, as in its pod) against the embedded API
served over HTTP by this process, through a proxy that counts bytes and can expire watches the way an
API server does (410 Gone). Phases, over N seeded Nodes and Devices records (8 GPUs, 5 NICs each):

- first sync: start on a fleet never published; requests per record, seconds, log bytes per record (a
  first publication posts no Event: two writes per record)
- steady: nothing changes for a while; requests and bytes, scaled to per node-hour
- change: K records lose their RDMA links (what the agent writes); requests and bytes per change
- restart: a new process over the published fleet; requests per record, seconds
- replay: every watch expired (410 Gone), kopf relists; requests per record
- memory: resident set after a restart over N and over N/5 published records, the slope per record, and
  the peak (VmHWM) of a first sync, a restart and a replay: what the pod's memory limit must hold

Restart, replay and memory run over a fleet seeded as a first sync leaves it, so that their figures do not
depend on the first sync (`--sync-records` sizes that one separately).

Baselines measured in the same run: a no-op kopf operator (the same watches, handlers that do nothing)
over the same fleet, for seconds and memory; and the operator as it was before issue 15 (`--before`, a
git revision; its package is run from `git archive`) at a smaller size, for requests and log bytes.

Side by side (`--versus 500,2000,5000 [--rounds 3]`, only these figures): for each size, the operator
and the no-op kopf operator each over a fresh copy of the same records, a first sync (the operator: every
record published, its status written; the no-op: every record seen) and a restart over the records as a
first sync leaves them, pass by pass interleaved; the medians of seconds and process CPU, their ratios,
the operator's requests per record, and the embedded API's CPU in this process for each side (on a 2-core
machine it competes with the operator for wall time; a real API server is elsewhere).

NFD missing (`--crd-missing 2000 [--before REV] [--window 60]`, only these figures): a first sync of N
records where every NodeFeature create is answered as by an API server without NFD's CRD (404, a Status
naming no object; the proxy answers it, the start-up listing passes, as the operator exits at start
without it); the requests per second the operator sends and the lines it logs over the window from its
start, for the operator now and the one at REV (run from `git archive`).

Usage: hack/bench_operator.py [--records 5000] [--sync-records 5000] [--before-records 500]
                              [--before 3482377] [--changes 100]
       hack/bench_operator.py --versus 500,2000,5000 [--rounds 3]
       hack/bench_operator.py --crd-missing 2000 --before HEAD~1 [--window 60]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "operator"), str(ROOT / "devicemanager"), str(ROOT / "tests" / "operator")]

import aiohttp  # noqa: E402
from operator_records import devices, gpu, group, nic, nvlink  # noqa: E402
from watch_breaker import WatchBreaker, watch_breaker  # noqa: E402

from nodefabric_devicemanager import crd, models  # noqa: E402
from nodefabric_devicemanager.models import LinkState  # noqa: E402
from nodefabric_operator import labels, noderecord, onnode, sinks  # noqa: E402
from nodefabric_operator.demo.kubeapi import RunningAPI, running_api  # noqa: E402

NS = "nodefabric"
DEVICES = f"{models.GROUP}/{models.VERSION}/{models.PLURAL}"
NF = "nfd.k8s-sigs.io/v1alpha1/nodefeatures"
WRITES = [("POST", NF), ("PATCH", NF), ("PATCH", DEVICES), ("POST", "v1/events")]
KINDS = [
    (m, r) for r in (DEVICES, NF, "v1/nodes", "v1/events") for m in ("GET", "POST", "PATCH", "PUT", "DELETE")
]
STEADY_S = 10.0
IDLE_S = 7.0  # kopf ends a per-object worker, and drops the last body it held, after 5 s idle
RECONCILES = "nodefabric_operator_reconciles_total"
SKIPPED = "nodefabric_operator_events_skipped_total"
DEFAULT_BEFORE = "3482377"  # the last revision before issue 15's operator work

PROBE = """
import sys, time, urllib.request
up = False
while True:
    started = time.monotonic()
    try:
        with urllib.request.urlopen(sys.argv[1], timeout=30) as r:
            r.read()
        print(f"{time.monotonic() - started:.3f}", flush=True)
        up = True
    except OSError:
        print("down" if up else "", flush=True)  # before the first answer: not listening yet
    time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
"""

NOOP = """
import asyncio, sys, kopf
n = int(sys.argv[1])
registry = kopf.OperatorRegistry()
seen = set()
kopf.on.login(registry=registry)(lambda **kw: kopf.login_with_kubeconfig(**kw))
@kopf.on.event("worker.gpustack.ai", "v1alpha1", "devices", registry=registry)
def devices(name, **_):
    seen.add(name)
    if len(seen) == n:
        print("DONE", flush=True)
@kopf.on.event("nfd.k8s-sigs.io", "v1alpha1", "nodefeatures", registry=registry)
def nodefeatures(**_):
    pass
asyncio.run(kopf.operator(registry=registry, standalone=True, clusterwide=True))
"""


def record(name: str, link: LinkState = LinkState.OK) -> models.Devices:
    switches = [["0000:18:08.0", "0000:17:00.0", f"0000:16:0{i}.0"] for i in range(4)]
    nics = [nic(f"ibp{i}s0", bus_id=f"0000:2{i}:00.0", numa=str(i // 2), switches=switches[i], link=link)
            for i in range(4)]  # fmt: skip
    nics.append(nic("ens9np0", bus_id="0000:1b:00.0", numa="0", switches=[], link=link))
    gpus = [gpu(i, fabric=nvlink(), switches=switches[i // 2], numa=str(i // 4)) for i in range(8)]
    return devices(name, interfaces=nics, groups=[group("nvidia", *gpus)])


def seed(k: RunningAPI, n: int, *, published: bool = False) -> None:
    """N Nodes and their records as the agent leaves them: owned by the Node, conditions in status.
    `published`: also what the operator's first sync leaves (labels in status, the NodeFeature), made
    by the operator's own functions, so a restart over it has nothing to write."""
    for i in range(n):
        name = f"gpu-{i:05d}"
        node = k.api.put_object("v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
        body = record(name).wire()
        body["metadata"]["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"]}
        ]
        status = models.DevicesStatus(
            conditions=[
                models.Condition(type=models.INTERFACES_ENUMERATED, status="True", reason="Enumerated"),
                models.Condition(type=models.ACCELERATORS_ENUMERATED, status="True", reason="Enumerated"),
            ]
        )
        body["metadata"]["uid"] = str(uuid.uuid4())
        body["status"] = (_published(body, status) if published else status).wire()
        k.api.put_object(DEVICES, body)
        if published:
            owner = {"apiVersion": models.API_VERSION, "kind": models.KIND, "name": name, "controller": True}
            meta = {
                "name": name,
                "namespace": NS,
                "labels": {sinks.NFD_NODE_NAME: name, sinks.MANAGED_BY: sinks.MANAGER},
                "ownerReferences": [{**owner, "uid": body["metadata"]["uid"]}],
            }
            spec = {"labels": body["status"]["labels"]}
            k.api.put_object(
                NF,
                {
                    "apiVersion": "nfd.k8s-sigs.io/v1alpha1",
                    "kind": "NodeFeature",
                    "metadata": meta,
                    "spec": spec,
                },
            )


def _published(body: dict[str, Any], status: models.DevicesStatus) -> models.DevicesStatus:
    """The status the operator's first sync writes for this record, by the operator's own functions:
    LabelsOnNode included (the Nodes here carry none of the labels: no nfd-master copies them), or a
    restart would write it for every record."""
    name = body["metadata"]["name"]
    result = labels.compute(models.Devices.from_wire(body))
    plan = labels.plan({}, result.labels, domain=labels.DEFAULT_DOMAIN)
    done = sinks.Published(f"NodeFeature {NS}/{name}", plan, True, None)
    condition = noderecord.condition_for(done, result, frozenset(), None)
    on_node = onnode.condition(name, plan.managed, {}, labels.DEFAULT_DOMAIN, "nfd-master")
    return noderecord.next_status(status, result, done, condition, noderecord.now(), also=(on_node,))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Process:
    """One operator process: its pid's CPU and memory, its metrics, its log."""

    argv: list[str]
    env: dict[str, str]
    log: Path
    metrics_port: int | None = None
    proc: asyncio.subprocess.Process | None = None
    started: float = 0.0
    lines: list[str] = field(default_factory=list)

    async def start(self) -> None:
        self.started = time.monotonic()
        with open(self.log, "ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, stdout=subprocess.PIPE, stderr=log, env=self.env
            )

    async def wait_line(self, text: str, timeout: float) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async with asyncio.timeout(timeout):
            while True:
                line = (await self.proc.stdout.readline()).decode()
                if not line:
                    raise RuntimeError(f"{self.argv[0]} exited before printing {text!r}; see {self.log}")
                if text in line:
                    return

    def rss_mib(self, field: str = "VmRSS") -> float:
        """Resident memory now, or with "VmHWM" its peak so far (what a memory limit must hold)."""
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def cpu_s(self) -> float:
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    async def metric(self, name: str, **labels: str) -> float:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        try:
            async with aiohttp.ClientSession() as s, s.get(url) as r:
                text = await r.text()
        except aiohttp.ClientError:
            return 0.0
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        pattern = re.escape(f"{name}{{{want}}}" if want else name) + r" ([0-9.e+]+)"
        found = re.search(pattern, text)
        return float(found.group(1)) if found else 0.0

    async def stop(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), 60)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


def spend(k: RunningAPI) -> dict[tuple[str, str], int]:
    return {key: k.count(*key) for key in KINDS}


def per_record(after: dict[tuple[str, str], int], before: dict[tuple[str, str], int], n: int) -> float:
    return sum(after[key] - before[key] for key in after) / n


async def until(check: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what} after {timeout:.0f} s")
        await asyncio.sleep(0.1)


async def quiet(k: RunningAPI, seconds: float = 1.0) -> None:
    while True:
        before = k.count()
        await asyncio.sleep(seconds)
        if k.count() == before:
            return


def log_bytes(path: Path, since: int) -> tuple[int, int]:
    """(bytes, lines) written to the log after offset `since`."""
    data = path.read_bytes()[since:]
    return len(data), data.count(b"\n")


@dataclass
class Figures:
    """Every figure printed as it is measured, and kept by name for the ratios at the end."""

    values: dict[str, float] = field(default_factory=dict)

    def add(self, key: str, value: float, unit: str = "", note: str = "") -> None:
        self.values[key] = value
        shown = f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
        print(f"  {key:<52} {shown}{unit}{f'  ({note})' if note else ''}", flush=True)


def operator_argv(metrics_port: int, kubeconfig: str, *, health: bool = True) -> list[str]:
    """The operator's command line; `health`: /healthz on the metrics port too (the operator before issue
    15 served it from kopf on a port of its own)."""
    command = ["operator", "--standalone", "--namespace", NS, "--kubeconfig", kubeconfig]
    ports = ["--metrics-port", str(metrics_port)] + (["--health-port", str(metrics_port)] if health else [])
    return [sys.executable, "-m", "nodefabric_operator.console", *command, *ports]


NFD_CRD = f"{sinks.NFD_PLURAL}.{sinks.NFD_GROUP}"
NF_PLURAL = sinks.NFD_PLURAL


def nodefeature_crd() -> dict[str, Any]:
    """NFD's NodeFeature CRD as far as the operator needs it (schema-less): one that can be deleted."""
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    version = {"name": sinks.NFD_VERSION, "served": True, "storage": True, "schema": schema}
    names = {"plural": sinks.NFD_PLURAL, "singular": "nodefeature", "kind": "NodeFeature"}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": NFD_CRD},
        "spec": {"group": sinks.NFD_GROUP, "scope": "Namespaced", "names": names, "versions": [version]},
    }


@contextlib.asynccontextmanager
async def fleet(
    n: int, *, published: bool = False, nfd_crd: bool = False
) -> AsyncIterator[tuple[RunningAPI, WatchBreaker]]:
    crds = [crd.devices_crd()] + ([nodefeature_crd()] if nfd_crd else [])
    async with running_api(crds) as k, watch_breaker(k.url) as proxy:
        seed(k, n, published=published)
        yield k, proxy


async def _at_least(op: Process, name: str, value: float, **labels: str) -> bool:
    return await op.metric(name, **labels) >= value


@contextlib.asynccontextmanager
async def probing(op: Process, out: Figures, label: str) -> AsyncIterator[None]:
    """kubelet's liveness probe meanwhile: GET /healthz once a second from a process of its own (this
    one is busy serving the API), timed; the slowest answer and how many took over kubelet's default
    timeoutSeconds (1 s) are printed; a refused connection counts as late once the port has answered."""
    url = f"http://127.0.0.1:{op.metrics_port}/healthz"
    prober = await asyncio.create_subprocess_exec(sys.executable, "-c", PROBE, url, stdout=subprocess.PIPE)
    try:
        yield
    finally:
        prober.terminate()
        stdout, _ = await prober.communicate()
    took = [float(a) if a != "down" else math.inf for a in stdout.decode().split()]
    late = sum(t > 1.0 for t in took)
    slowest = max(took, default=math.nan)
    out.add(f"{label}: slowest /healthz answer", slowest, " s", f"{late} of {len(took)} over 1 s or none")


async def written(k: RunningAPI, op: Process, n: int, before: dict[tuple[str, str], int]) -> None:
    """Until the first sync published every record: each ends with its status write, which the embedded
    API counts in this process; then the operator's metric confirms it. Scraping /metrics ten times a
    second instead cost the operator 3-6 ms of CPU a scrape, which the no-op is never charged."""
    status = ("PATCH", DEVICES)
    await until(lambda: k.count(*status) - before[status] >= n, 3600, "every status written")
    await until(lambda: _at_least(op, RECONCILES, n, outcome="published"), 600, f"{n} published")


async def first_sync(
    op: Process, k: RunningAPI, n: int, out: Figures, label: str, *, probe: bool = True
) -> None:
    before, log0 = spend(k), op.log.stat().st_size if op.log.exists() else 0
    api_cpu = time.process_time()
    async with probing(op, out, f"{label} first sync") if probe else contextlib.nullcontext():
        await op.start()
        await written(k, op, n, before)
    seconds = time.monotonic() - op.started
    await quiet(k)
    size, lines = log_bytes(op.log, log0)
    out.add(f"{label} first sync: requests per record", per_record(spend(k), before, n))
    out.add(f"{label} first sync: seconds", seconds, " s", f"{seconds / n * 1000:.1f} s per 1,000 records")
    out.add(f"{label} first sync: log bytes per record", size / n, " B", f"{lines} lines in all")
    cpu = f"the embedded API in this process: {time.process_time() - api_cpu:.1f} s"
    out.add(f"{label} first sync: operator CPU", op.cpu_s(), " s", cpu)
    out.add(f"{label} first sync: peak RSS", op.rss_mib("VmHWM"), " MiB")


async def steady(k: RunningAPI, proxy: WatchBreaker, n: int, out: Figures) -> None:
    """Nothing changes: what the operator asks of the API server meanwhile, per node and hour. kopf
    reopens a watch that delivered nothing for 70 s; an API server's bookmarks (about one a minute)
    prevent that, the embedded API sends none, so a window that spans it counts that watch."""
    await quiet(k, 3.0)
    before, wire0 = spend(k), proxy.bytes_up + proxy.bytes_down
    await asyncio.sleep(STEADY_S)
    scale = 3600 / STEADY_S / n
    after = spend(k)
    seen = {
        f"{m} {r.rsplit('/', 1)[-1]}": after[m, r] - before[m, r]
        for m, r in after
        if after[m, r] > before[m, r]
    }
    out.add(
        "now steady: requests per node-hour", per_record(spend(k), before, 1) * scale, "", str(seen or "")
    )
    out.add("now steady: bytes per node-hour", (proxy.bytes_up + proxy.bytes_down - wire0) * scale, " B")


async def change(k: RunningAPI, proxy: WatchBreaker, count: int, out: Figures) -> None:
    """`count` records lose every RDMA link, as the agent would write it; the operator follows."""
    before, wire0 = spend(k), proxy.bytes_up + proxy.bytes_down
    writes0 = sum(k.count(*w) for w in WRITES)
    async with aiohttp.ClientSession() as s:
        for i in range(count):
            name = f"gpu-{i:05d}"
            url = f"{k.url}/apis/{models.GROUP}/{models.VERSION}/{models.PLURAL}/{name}"
            patch = {"spec": record(name, LinkState.FAILED).wire()["spec"]}
            headers = {"Content-Type": "application/merge-patch+json"}
            async with s.patch(url, json=patch, headers=headers) as r:
                assert r.status == 200, await r.text()
    # Ours (the spec PATCH) and the operator's three: the NodeFeature, the status, the Event.
    await until(lambda: sum(k.count(*w) for w in WRITES) - writes0 >= 4 * count, 600, "changes published")
    await quiet(k)
    out.add("now change: operator requests per changed record", per_record(spend(k), before, count) - 1)
    wire = proxy.bytes_up + proxy.bytes_down - wire0
    out.add("now change: bytes on the wire per changed record", wire / count, " B")


async def restart(op: Process, k: RunningAPI, n: int, out: Figures, label: str) -> None:
    before = spend(k)
    async with probing(op, out, f"{label} restart"):
        await op.start()
        await until(lambda: _at_least(op, RECONCILES, n, outcome="unchanged"), 3600, "the restart's sync")
    seconds = time.monotonic() - op.started
    await quiet(k)
    out.add(f"{label} restart: requests per record", per_record(spend(k), before, n))
    out.add(f"{label} restart: seconds", seconds, " s", f"{seconds / n * 1000:.1f} s per 1,000 records")
    out.add(f"{label} restart: operator CPU", op.cpu_s(), " s")
    out.add(f"{label} restart: RSS", op.rss_mib(), " MiB", "as the listings left it")
    out.add(f"{label} restart: peak RSS", op.rss_mib("VmHWM"), " MiB")
    await asyncio.sleep(IDLE_S)
    out.add(f"{label} restart: RSS when idle", op.rss_mib(), " MiB")


async def replay(op: Process, k: RunningAPI, proxy: WatchBreaker, n: int, out: Figures) -> None:
    before = spend(k)
    seen = await op.metric(SKIPPED, resource="devices")
    started = time.monotonic()
    async with probing(op, out, f"{n} replay"):
        proxy.expire_watches()
        await until(lambda: _at_least(op, SKIPPED, seen + n, resource="devices"), 3600, "the replay")
    seconds = time.monotonic() - started
    await quiet(k)
    out.add(f"{n} replay: requests per record", per_record(spend(k), before, n), "", "relist after 410 Gone")
    out.add(f"{n} replay: seconds", seconds, " s")
    out.add(f"{n} replay: peak RSS", op.rss_mib("VmHWM"), " MiB", "the restart's and the relist's")


async def run_sync(n: int, changes: int, workdir: Path, out: Figures) -> None:
    """First sync, steady state, changes and a restart over a fleet the operator publishes itself."""
    async with fleet(n) as (k, proxy):
        env = dict(os.environ, POD_NAME="bench")
        port = free_port()
        argv = operator_argv(port, proxy.kubeconfig)
        op = Process(argv, env, workdir / "operator.log", port)
        again = Process(argv, env, workdir / "operator.log", port)
        try:
            await first_sync(op, k, n, out, "now")
            await steady(k, proxy, n, out)
            await change(k, proxy, min(changes, n), out)
            await op.stop()
            await restart(again, k, n, out, "after the sync,")
        finally:
            await op.stop()
            await again.stop()


async def run_published(n: int, workdir: Path, out: Figures) -> None:
    """A restart and a watch replay over a fleet already published (seeded as the first sync leaves it)."""
    async with fleet(n, published=True) as (k, proxy):
        port = free_port()
        op = Process(
            operator_argv(port, proxy.kubeconfig), dict(os.environ), workdir / f"published-{n}.log", port
        )
        try:
            await restart(op, k, n, out, f"{n}")
            await replay(op, k, proxy, n, out)
        finally:
            await op.stop()


async def run_noop(n: int, workdir: Path, out: Figures) -> None:
    script = workdir / "noop.py"
    script.write_text(NOOP)
    async with fleet(n, published=True) as (k, proxy):
        env = dict(os.environ, KUBECONFIG=proxy.kubeconfig)
        op = Process([sys.executable, str(script), str(n)], env, workdir / "noop.log")
        await op.start()
        try:
            await op.wait_line("DONE", 3600)
            seconds = time.monotonic() - op.started
            await quiet(k)
            out.add(f"{n} no-op kopf: seconds to see every record", seconds, " s")
            out.add(f"{n} no-op kopf: CPU", op.cpu_s(), " s")
            out.add(f"{n} no-op kopf: RSS", op.rss_mib(), " MiB")
            out.add(f"{n} no-op kopf: peak RSS", op.rss_mib("VmHWM"), " MiB")
        finally:
            await op.stop()


async def run_before(rev: str, n: int, workdir: Path, out: Figures) -> bool:
    source = _archived(rev, workdir)
    if source is None:
        return False
    async with fleet(n) as (k, proxy):
        env = dict(os.environ, PYTHONPATH=str(source), POD_NAME="bench")
        port = free_port()
        argv = operator_argv(port, proxy.kubeconfig, health=False)
        op, again = (
            Process(argv, env, workdir / "before.log", port),
            Process(argv, env, workdir / "before.log", port),
        )
        try:
            await first_sync(op, k, n, out, "before", probe=False)
            await op.stop()
            before = spend(k)
            await again.start()
            await until(lambda: _at_least(again, RECONCILES, n, outcome="unchanged"), 3600, "restart")
            await quiet(k)
            out.add("before restart: requests per record", per_record(spend(k), before, n))
        finally:
            await op.stop()
            await again.stop()
    return True


async def _noop_pass(n: int, workdir: Path, published: bool) -> tuple[float, float, float]:
    """The do-nothing kopf operator over a fresh fleet: (seconds until it saw every record, CPU, the
    embedded API's CPU meanwhile)."""
    script = workdir / "noop.py"
    script.write_text(NOOP)
    async with fleet(n, published=published) as (_k, proxy):
        env = dict(os.environ, KUBECONFIG=proxy.kubeconfig)
        op = Process([sys.executable, str(script), str(n)], env, workdir / "noop.log")
        api_cpu = time.process_time()
        await op.start()
        try:
            await op.wait_line("DONE", 3600)
            return time.monotonic() - op.started, op.cpu_s(), time.process_time() - api_cpu
        finally:
            await op.stop()


async def _operator_pass(n: int, workdir: Path, published: bool) -> tuple[float, float, float, float]:
    """The operator over a fresh fleet, a first sync (`published` False: every record published, its
    status written; a first publication posts no Event) or a restart (every record found unchanged):
    (seconds, CPU, the embedded API's CPU meanwhile, requests per record)."""
    async with fleet(n, published=published) as (k, proxy):
        port = free_port()
        env = dict(os.environ, POD_NAME="bench")
        op = Process(operator_argv(port, proxy.kubeconfig), env, workdir / "versus.log", port)
        before, api_cpu = spend(k), time.process_time()
        await op.start()
        try:
            if published:
                await until(lambda: _at_least(op, RECONCILES, n, outcome="unchanged"), 3600, "restart")
            else:
                await written(k, op, n, before)
            seconds, cpu, api = time.monotonic() - op.started, op.cpu_s(), time.process_time() - api_cpu
            await quiet(k)
            return seconds, cpu, api, per_record(spend(k), before, n)
        finally:
            await op.stop()


async def versus(sizes: list[int], rounds: int, workdir: Path) -> None:
    """The operator against the do-nothing kopf operator over the same records, first sync and restart,
    interleaved pass by pass so a machine shared with other work slows both alike; medians printed."""
    for n in sizes:
        for phase, published in (("first sync", False), ("restart", True)):
            ours: list[tuple[float, float, float, float]] = []
            noop: list[tuple[float, float, float]] = []
            for _ in range(rounds):
                ours.append(await _operator_pass(n, workdir, published))
                noop.append(await _noop_pass(n, workdir, published))
            s, c = statistics.median(o[0] for o in ours), statistics.median(o[1] for o in ours)
            ns, nc = statistics.median(o[0] for o in noop), statistics.median(o[1] for o in noop)
            a, na = statistics.median(o[2] for o in ours), statistics.median(o[2] for o in noop)
            requests = max(o[3] for o in ours)
            # Each pass against the no-op pass run right after it: how far one pair strays from the medians.
            tr = [o[0] / p[0] for o, p in zip(ours, noop, strict=True)]
            cr = [o[1] / p[1] for o, p in zip(ours, noop, strict=True)]
            print(
                f"  {n:>6} {phase:<10}  operator {s:7.2f} s {c:7.2f} s CPU   no-op kopf {ns:7.2f} s"
                f" {nc:7.2f} s CPU   x{s / ns:.2f} time  x{c / nc:.2f} CPU   {requests:.2f} requests/record"
                f"   (pairs: x{min(tr):.2f}-{max(tr):.2f} time, x{min(cr):.2f}-{max(cr):.2f} CPU;"
                f" the embedded API's CPU: {a:.2f} s, {na:.2f} s)",
                flush=True,
            )


def _archived(rev: str, workdir: Path) -> Path | None:
    """The operator package at `rev`, unpacked under `workdir` (its source root), None when git fails."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "operator/nodefabric_operator"],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        print(f"  (no figures before: git archive {rev} failed: {archive.stderr.decode().strip()})")
        return None
    tree = workdir / f"tree-{len(list(workdir.glob('tree-*')))}"
    tree.mkdir()
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tree, filter="data")
    return tree / "operator"


async def crd_missing(
    n: int, window: float, label: str, *, source: Path | None, workdir: Path, out: Figures
) -> None:
    """A first sync of N records with every NodeFeature create refused as the API server refuses a
    resource it does not serve: what the operator sends and logs over `window` seconds from its start."""
    async with fleet(n) as (k, proxy):
        proxy.refuse("POST", f"/apis/{sinks.NFD_GROUP}/", 404)
        env = dict(os.environ, POD_NAME="bench")
        if source is not None:
            env["PYTHONPATH"] = str(source)
        port = free_port()
        log = workdir / f"crd-missing-{label}.log"
        op = Process(operator_argv(port, proxy.kubeconfig, health=source is None), env, log, port)
        created = "nodefabric_operator_api_requests_total"

        async def sent() -> float:
            # The creates the proxy refused never reach the embedded API, which counts the rest.
            return k.count() + await op.metric(created, verb="create", resource=NF_PLURAL)

        try:
            start = await sent()
            await op.start()
            await asyncio.sleep(window / 2)
            half = await sent()
            await asyncio.sleep(window / 2)
            end = await sent()
            size, lines = log_bytes(log, 0)
            name = f"{label} NFD missing, {n} records:"
            out.add(f"{name} requests/s", (end - start) / window, "", f"the first {window:.0f} s")
            out.add(f"{name} requests/s, second half", (end - half) / window * 2, "", "after the first tries")
            out.add(
                f"{name} NodeFeature creates", await op.metric(created, verb="create", resource=NF_PLURAL)
            )
            out.add(f"{name} log lines", lines, "", f"{size:,} bytes")
        finally:
            await op.stop()


async def nfd_missing(n: int, window: float, before: str, workdir: Path, out: Figures) -> None:
    """`--crd-missing`: the operator now, then the one at `before`."""
    print(f"NFD missing: a first sync of {n} records, {window:.0f} s from the start")
    try:
        await crd_missing(n, window, "now", source=None, workdir=workdir, out=out)
        source = _archived(before, workdir)
        if source is not None:
            await crd_missing(n, window, "before", source=source, workdir=workdir, out=out)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def compiled() -> None:
    """Byte-compile the operator's packages, as the image's `pip install` does. An editable checkout run
    with PYTHONDONTWRITEBYTECODE (this machine's default, and the image's) compiles every module of
    ours again on each start, 0.2-0.3 s of CPU that the no-op (kopf, installed and compiled) never pays
    and the pod does not either."""
    packages = [
        ROOT / "operator" / "nodefabric_operator",
        ROOT / "devicemanager" / "nodefabric_devicemanager",
    ]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *map(str, packages)], check=True)


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--versus",
        default="",
        help="only the side-by-side figures: comma-separated fleet sizes (e.g. 500,2000,5000)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="passes of each side per size (--versus)")
    parser.add_argument("--records", type=int, default=5000, help="restart, replay and memory")
    parser.add_argument("--sync-records", type=int, default=5000, help="first sync, steady state, changes")
    parser.add_argument("--before-records", type=int, default=500, help="0: no figures before")
    parser.add_argument("--before", default=DEFAULT_BEFORE, help="git revision of the operator before")
    parser.add_argument("--changes", type=int, default=100)
    parser.add_argument("--crd-missing", type=int, default=0, help="only NFD's CRD deleted under N records")
    parser.add_argument("--window", type=float, default=60.0, help="seconds measured (--crd-missing)")
    args = parser.parse_args()
    n, small = args.records, max(1, args.records // 5)
    compiled()
    workdir = Path(tempfile.mkdtemp(prefix="nf-bench-op-"))
    out = Figures()
    v = out.values
    if args.crd_missing:
        await nfd_missing(args.crd_missing, args.window, args.before, workdir, out)
        return
    if args.versus:
        print(f"the operator against a do-nothing kopf operator, medians of {args.rounds} interleaved passes")
        try:
            await versus([int(x) for x in args.versus.split(",")], args.rounds, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        return
    try:
        print(f"the operator, a first sync of {args.sync_records} records (the embedded API in this process)")
        await run_sync(args.sync_records, args.changes, workdir, out)
        print(f"the operator over {n} and {small} records already published")
        await run_published(n, workdir, out)
        await run_published(small, workdir, out)
        print(f"baseline: a no-op kopf operator over the same {n} and {small} records")
        await run_noop(n, workdir, out)
        await run_noop(small, workdir, out)
        ratio = v[f"{n} restart: seconds"] / v[f"{n} no-op kopf: seconds to see every record"]
        out.add("ratio: restart seconds / no-op kopf seconds", ratio)
        if n > small:
            for who, key in (("the operator", "restart: RSS"), ("no-op kopf", "no-op kopf: RSS")):
                slope = (v[f"{n} {key}"] - v[f"{small} {key}"]) / (n - small) * 1000
                out.add(f"memory per 1,000 records, {who} (RSS slope)", slope, " MiB")
        if args.before_records > 0:
            print(f"the operator before ({args.before}), a first sync of {args.before_records} records")
            if await run_before(args.before, args.before_records, workdir, out):
                for what in ("requests per record", "log bytes per record"):
                    ratio = v[f"before first sync: {what}"] / v[f"now first sync: {what}"]
                    out.add(f"ratio: first-sync {what}, before / now", ratio)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
