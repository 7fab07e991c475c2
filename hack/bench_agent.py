"""Benchmark: what one node agent costs, against what the old per-pass GET and full read cost, in one run.

    .venv/bin/python hack/bench_agent.py [--pfs 8] [--vfs 128] [--passes 50] [--settle 8] [--idle 20]

On a generated 8 PF x 128 VF tree (1,032 RDMA devices, each with a netdev):
1. Host pass: the link refresh each interval runs (port state/phys_state, operstate) against a bare
   `open(path, "rb").read()` loop over the same files (target <= 1.25x), the os.open/os.read floor, and the
   full walk every pass used to do.
2. API traffic through a counting TCP proxy in front of the embedded API: bytes and requests per pass of
   the old way (GET the object, read the whole host, decide) and of the running agent (refresh, decide
   against the object it keeps, a watch), and one watch reconnect; per node-hour at a 60 s interval.
3. Resident memory of a real `nodefabric agent` process on that tree with the device plugin in-process
   and a kubelet registered (target <= 64 MiB), beside the memory `import kubernetes` alone costs; and with
   `--serve both` (the DRA driver in-process too: registered with kubelet's plugin watcher, slices
   published) beside `--serve deviceplugin` on the same tree; each tree and serve mode beside the agent
   before its memory work (`--before-ref`, run from its own sources); and the idle CPU of both on the
   typical node.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from nodefabric_devicemanager import crd, inventory, nodeclient, refresh
from nodefabric_devicemanager.agent import publish
from nodefabric_devicemanager.agent.core import Agent, AgentConfig, PassKind
from nodefabric_devicemanager.agent.kube import DevicesClient
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.testing.scenarios import bench, gpu8
from nodefabric_deviceplugin.testing.drakubelet import DraKubelet
from nodefabric_deviceplugin.testing.kubelet import KubeletEmulator
from nodefabric_operator.demo.dra import SLICES
from nodefabric_operator.demo.kubeapi import running_api

NODE = "bench-node"
INTERVAL_S = 60.0
WATCH_RECONNECTS_PER_HOUR = 3600 / 450  # the agent asks for watches of 300-600 s
BOOKMARK_BYTES = 250  # a BOOKMARK event of a custom resource; the API server sends about one a minute
BOOKMARKS_PER_HOUR = 60
BUDGET_MIB = 64.0
DRIVER = "rdma.gpustack.ai"
# The console script's body, so the old agent runs from its own unpacked sources through PYTHONPATH.
MAIN = "import sys; from nodefabric_operator.console import main; sys.exit(main())"


def median_time(fn: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


# --- 1. the host pass -----------------------------------------------------------------------------------


def host_pass(root: Path, rounds: int) -> None:
    host = HostRoot.at(root)
    reading = inventory.read(host)
    assert reading.interfaces is not None
    plan = refresh.plan(host, reading.interfaces)
    before = refresh.snapshot(plan)
    files = plan.files

    def bare() -> None:
        for path in files:
            with open(path, "rb") as f:
                f.read()

    def floor() -> None:
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            os.read(fd, 4096)
            os.close(fd)

    def refreshed() -> None:
        after = refresh.snapshot(plan)
        if after != before:
            refresh.judge(plan, before, after)

    for fn in (bare, floor, refreshed):
        fn()  # warm the dentry cache for all three alike
    t_bare = median_time(bare, rounds * 10)
    t_floor = median_time(floor, rounds * 10)
    t_refresh = median_time(refreshed, rounds * 10)
    t_walk = median_time(lambda: inventory.read(host), rounds)
    print(f"host pass ({len(plan.devices)} rdma devices, {len(plan.netdevs)} netdevs, {len(files)} files)")
    print(f"  bare open/read loop     {t_bare * 1e3:8.2f} ms")
    print(f"  os.open/os.read floor   {t_floor * 1e3:8.2f} ms")
    print(f"  link refresh            {t_refresh * 1e3:8.2f} ms   {t_refresh / t_bare:5.2f}x bare (<=1.25x), "
          f"{t_refresh / t_floor:5.2f}x floor")  # fmt: skip
    print(f"  full walk (each pass before) {t_walk * 1e3:8.1f} ms   {t_walk / t_refresh:5.0f}x the refresh")


# --- 2. API traffic ---------------------------------------------------------------------------------


class CountingProxy:
    """A TCP proxy in front of the embedded API that counts bytes both ways and can drop connections."""

    def __init__(self, target: str) -> None:
        url = urllib.parse.urlsplit(target)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 80
        self.up = 0  # bytes to the API server (requests)
        self.down = 0  # bytes from it (responses, watch events)
        self.connections = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self.url = ""

    async def start(self) -> None:
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upstream: bool) -> None:
        try:
            while data := await reader.read(65536):
                if upstream:
                    self.up += len(data)
                else:
                    self.down += len(data)
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer, True), self._pipe(up_reader, writer, False))
        self._writers -= {writer, up_writer}

    def reset(self) -> None:
        self.up = self.down = self.connections = 0

    def drop_all(self) -> None:
        for writer in list(self._writers):
            writer.close()

    @property
    def total(self) -> int:
        return self.up + self.down


async def _until(predicate: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the benchmark waited too long")
        await asyncio.sleep(0.01)


async def api_traffic(root: Path, passes: int) -> None:
    async with running_api([crd.devices_crd()]) as k:
        k.api.put_object("v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        proxy = CountingProxy(k.url)
        await proxy.start()
        kubeconfig = Path(k.kubeconfig).with_name("proxied")
        kubeconfig.write_text(Path(k.kubeconfig).read_text().replace(k.url, proxy.url))
        host = HostRoot.at(root)

        # The old way, per pass: GET the whole object, read the whole host, decide against the answer.
        client = DevicesClient(nodeclient.load(str(kubeconfig)))
        first = Agent(AgentConfig(node=NODE, root=str(root), watch=False), client)
        await first.run_pass(PassKind.WALK)  # creates the object
        size = len(str(k.api.stored("worker.gpustack.ai/v1alpha1/devices", NODE)))
        proxy.reset()
        old_rounds = 5
        before = k.count()
        for _ in range(old_rounds):
            stored = await asyncio.to_thread(client.get, NODE)
            reading = await asyncio.to_thread(inventory.read, host)
            plan = publish.plan(stored, reading, datetime.now(UTC).replace(microsecond=0))
            assert not plan.writes
        old_bytes, old_requests = proxy.total / old_rounds, (k.count() - before) / old_rounds

        # The running agent: refresh every interval, decide against the object it keeps, a watch.
        agent = Agent(
            AgentConfig(node=NODE, root=str(root), interval=0.02, walk_interval=3600),
            DevicesClient(nodeclient.load(str(kubeconfig))),
        )
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        refreshes = agent.metrics.registry.get_sample_value
        count = lambda: refreshes("nodefabric_agent_passes_total", {"kind": "refresh", "result": "ok"}) or 0  # noqa: E731
        await _until(lambda: agent.watch.connects == 1 and count() >= 2)
        proxy.reset()
        start, requests_before = count(), k.count()
        await _until(lambda: count() >= start + passes)
        new_bytes = proxy.total / passes
        new_requests = (k.count() - requests_before) / passes
        # One watch reconnect, as the API server ending the watch after its timeoutSeconds causes.
        proxy.reset()
        connects = agent.watch.connects
        proxy.drop_all()
        await _until(lambda: agent.watch.connects > connects)
        await asyncio.sleep(1.0)  # let the reconnect's answer arrive whole
        reconnect_bytes = proxy.total
        stop.set()
        await asyncio.wait_for(task, 30)

    per_hour = 3600 / INTERVAL_S
    old_hour = old_bytes * per_hour
    new_hour = (
        new_bytes * per_hour
        + reconnect_bytes * WATCH_RECONNECTS_PER_HOUR
        + BOOKMARK_BYTES * BOOKMARKS_PER_HOUR
    )
    print(f"api traffic (the Devices object is {size / 1024:.0f} KiB)")
    print(f"  old, per pass: GET + full read   {old_bytes / 1024:10.1f} KiB  {old_requests:.1f} request(s)")
    print(
        f"  agent, per pass ({passes} passes)   {new_bytes / 1024:10.3f} KiB  {new_requests:.1f} request(s)"
    )
    print(
        f"  one watch reconnect              {reconnect_bytes / 1024:10.1f} KiB  (the embedded API replays "
        "the object; a real API server resumes from the resourceVersion without it)"
    )
    print(
        f"  per node-hour at {INTERVAL_S:.0f} s: old {old_hour / 2**20:.2f} MiB, "
        f"agent {new_hour / 2**20:.3f} MiB "
        f"= {new_hour / old_hour:.1%} of old ({WATCH_RECONNECTS_PER_HOUR:.0f} reconnects as measured, "
        f"{BOOKMARKS_PER_HOUR} bookmarks of ~{BOOKMARK_BYTES} B modelled)"
    )
    print(
        f"  requests per node-hour: old {old_requests * per_hour:.0f}, agent "
        f"{new_requests * per_hour + WATCH_RECONNECTS_PER_HOUR:.0f} (watch reconnects); writes 0 in both"
    )


# --- 3. resident memory -------------------------------------------------------------------------------


def _rss_mib(pid: int) -> tuple[float, float]:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":", 1) for line in status if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def _old_agent(ref: str, into: Path) -> dict[str, str] | None:
    """The agent as of `ref` (before issue 15), unpacked from git, to measure beside this one."""
    repo = Path(__file__).resolve().parents[1]
    try:
        archive = subprocess.run(
            ["git", "-C", str(repo), "archive", ref, "devicemanager", "deviceplugin", "operator"],
            capture_output=True, check=True,
        )  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    roots = [str(into / part) for part in ("devicemanager", "deviceplugin", "operator")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(roots)}


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _agent_rss(
    root: Path,
    settle: float,
    env: dict[str, str] | None,
    *,
    serve: str = "deviceplugin",
    interval: float = 1.0,
    idle: float = 0.0,
) -> tuple[float, float, float]:
    """(resident MiB, peak MiB, CPU share of one core over `idle` seconds after settling)."""
    base = tempfile.mkdtemp(prefix="nf-bench-", dir="/tmp")  # unix socket paths are short
    plugin_dir = f"{base}/dp"
    dra_flags = ["--serve", serve, "--dra-plugin-dir", f"{base}/p", "--dra-registry-dir", f"{base}/r",
                 "--dra-cdi-dir", f"{base}/c"] if serve != "deviceplugin" else []  # fmt: skip
    async with running_api([crd.devices_crd()]) as k:
        k.api.put_object("v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        kubelet, dra_kubelet = KubeletEmulator(plugin_dir), DraKubelet(f"{base}/r")
        await kubelet.start()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", MAIN,
            "agent", "--node-name", NODE, "--root", str(root), "--kubeconfig", k.kubeconfig,
            "--plugin-dir", plugin_dir, "--interval", str(interval),
            "--metrics-port", "0", "--health-port", "0",
            *dra_flags, stderr=asyncio.subprocess.DEVNULL, env=env,
        )  # fmt: skip
        try:
            await _until(lambda: kubelet.registrations("device.gpustack.ai/rdma") >= 1)
            if dra_flags:  # the driver registered with kubelet's plugin watcher and synced its pool
                await dra_kubelet.wait_registered(DRIVER, timeout=120)
                # A LIST starts every sync; a node whose NICs are all split into VFs has no pool to write.
                await _until(lambda: k.count("GET", SLICES) >= 1)
            await asyncio.sleep(settle)  # passes keep running; memory must hold still
            cpu, started = _cpu_s(proc.pid), time.monotonic()
            await asyncio.sleep(idle)
            share = (_cpu_s(proc.pid) - cpu) / (time.monotonic() - started) if idle else 0.0
            return (*_rss_mib(proc.pid), share)
        finally:
            proc.terminate()
            await proc.wait()
            await dra_kubelet.stop()
            await kubelet.stop()


async def resident_memory(
    trees: dict[str, Path], settle: float, baseline_ref: str, before_ref: str, idle: float
) -> None:
    print(
        "resident memory of `nodefabric agent` with the device plugin in-process and registered with kubelet"
    )
    with (
        tempfile.TemporaryDirectory(prefix="nf-bench-old-") as old_dir,
        tempfile.TemporaryDirectory(prefix="nf-bench-before-") as before_dir,
    ):
        old_env = _old_agent(baseline_ref, Path(old_dir))
        # The agent before the memory work of issue 15, beside this one on each tree and in each serve mode.
        before_env = _old_agent(before_ref, Path(before_dir))
        now: dict[tuple[str, str], float] = {}
        for serve in ("deviceplugin", "both"):
            for name, root in trees.items():
                rss, peak, _ = await _agent_rss(root, settle, None, serve=serve)
                now[serve, name] = rss
                line = (
                    f"  {name:20} --serve {serve:12} {rss:5.1f} MiB (peak {peak:5.1f}, "
                    f"{rss / BUDGET_MIB:4.0%} of budget)"
                )
                if before_env is not None:
                    before, _, _ = await _agent_rss(root, settle, before_env, serve=serve)
                    line += f"   before ({before_ref}) {before:5.1f} MiB: {rss - before:+.1f} MiB"
                if old_env is not None and serve == "deviceplugin":
                    old_rss, _, _ = await _agent_rss(root, settle, old_env)
                    line += f"   old agent ({baseline_ref}) {old_rss:5.1f} MiB: {rss / old_rss:.2f}x"
                print(line)
        for name in trees:
            # The DRA driver in the same process (it offers the whole functions, the device plugin the VFs).
            print(
                f"  {name:20} --serve both costs {now['both', name] - now['deviceplugin', name]:+.1f} MiB "
                "beside --serve deviceplugin"
            )
    # Idle: no pass due (an hour's interval), kubelet's sockets watched with inotify on both sides.
    typical = next(iter(trees.values()))
    _, _, plugin_cpu = await _agent_rss(typical, 2.0, None, interval=3600, idle=idle)
    _, _, both_cpu = await _agent_rss(typical, 2.0, None, serve="both", interval=3600, idle=idle)
    print(
        f"  idle CPU over {idle:.0f} s, {next(iter(trees))}: --serve both {both_cpu:.3%} of a core, "
        f"--serve deviceplugin {plugin_cpu:.3%}"
        + (f" ({both_cpu / plugin_cpu:.1f}x)" if plugin_cpu else " (none measurable: no ratio)")
    )
    # VmRSS, not ru_maxrss: a child inherits its parent's high-water mark across exec.
    rss_of = "print(open('/proc/self/status').read().split('VmRSS:')[1].split()[0])"
    runs = [
        subprocess.run(
            [sys.executable, "-c", f"{imports}\n{rss_of}"], capture_output=True, text=True, check=True
        )
        for imports in ("import kubernetes", "pass")
    ]
    extra = (int(runs[0].stdout) - int(runs[1].stdout)) / 1024
    print(f"  for scale: `import kubernetes` adds {extra:.1f} MiB to Python (not imported by the agent)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pfs", type=int, default=8)
    parser.add_argument("--vfs", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--passes", type=int, default=50)
    parser.add_argument("--settle", type=float, default=8.0, help="steady seconds before reading RSS")
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of idle CPU measured")
    parser.add_argument("--baseline-ref", default="3482377", help="git revision of the agent before issue 15")
    parser.add_argument(
        "--before-ref", default="ad950a8", help="git revision of the agent before its memory work (issue 15)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nf-bench-agent-") as tmp:
        root, typical = Path(tmp) / "big", Path(tmp) / "gpu8"
        bench(root, pfs=args.pfs, vfs=args.vfs)
        gpu8(typical)
        print(f"tree: {args.pfs} PF x {args.vfs} VF")
        host_pass(root, args.rounds)
        asyncio.run(api_traffic(root, args.passes))
        trees = {"8 GPU, 5 NIC node": typical, f"{args.pfs} PF x {args.vfs} VF node": root}
        asyncio.run(resident_memory(trees, args.settle, args.baseline_ref, args.before_ref, args.idle))


if __name__ == "__main__":
    main()
