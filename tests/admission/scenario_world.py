"""The world the admission scenarios run in: the embedded API with a GPU fleet, the real placement process
(`nodefabric placement`, a subprocess with its own configuration file), the kube-scheduler stand-in, a
job controller stand-in that keeps each group's pods in existence (recreating evicted ones, gated, as a
Job or JobSet controller does), a foreign scheduler, and a watchdog for the one rule every scenario
asserts: no group stays partly bound past the timeout."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nodefabric_operator.demo.kubeapi import RunningAPI, load_crds, running_api
from nodefabric_operator.demo.scheduler import ForeignScheduler, StandInScheduler, is_ready

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "placement.gpustack.ai_placementgroups.yaml"
GPU = "nvidia.com/gpu"
GATE = "placement.gpustack.ai/group"
PLACEMENT_GROUPS = "placement.gpustack.ai/v1alpha1/placementgroups"
NS = "ml"
TIMEOUT_S = 6.0  # groupReadyTimeoutSeconds in these scenarios


def gpu_node(name: str, zone: str, region: str = "r1", *, product: str | None = "H100") -> dict[str, Any]:
    labels = {"topology.kubernetes.io/zone": zone, "topology.kubernetes.io/region": region}
    if product:
        labels["nvidia.com/gpu.product"] = product
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": {GPU: "8", "cpu": "96", "memory": "1Ti", "pods": "110"}},
    }


def group_pod(
    group: str,
    index: int,
    size: int | None,
    *,
    generation: int = 0,
    label: tuple[str, str] | None = None,
    **more: Any,
) -> dict[str, Any]:
    """Pod `index` of a group, gated as the webhook leaves it; named by `label` (default the explicit
    group label) and sized by the group-size annotation when `size` is given."""
    key, value = label or (GATE, group)
    labels = {key: value, **more.pop("labels", {})}
    annotations = {"placement.gpustack.ai/group-size": str(size)} if size else {}
    annotations.update(more.pop("annotations", {}))
    name = f"{group}-{index}" + (f"-r{generation}" if generation else "")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels, "annotations": annotations},
        "spec": {
            "schedulingGates": [{"name": GATE}],
            "containers": [
                {
                    "name": "w",
                    "image": "trainer:1",
                    "resources": {"requests": {GPU: "8"}, "limits": {GPU: "8"}},
                }
            ],
            **more,
        },
    }


JOB_NAME = "batch.kubernetes.io/job-name"


@dataclass
class Owner:
    """A job controller for one group: `size` pods, each recreated (gated, a new name) once it is gone."""

    group: str
    size: int
    label: tuple[str, str]
    declared: bool  # the pods carry the size (an explicit group); else their owner states it
    current: dict[int, str] = field(default_factory=dict)  # index -> the name of its pod now
    generations: dict[int, int] = field(default_factory=dict)
    extras: dict[int, dict[str, Any]] = field(default_factory=dict)
    recreated: int = 0


@dataclass
class Violation:
    group: str
    bound: int
    size: int
    since: float
    seconds: float


class World:
    def __init__(self, k: RunningAPI, config: Path, workdir: Path) -> None:
        self.k = k
        self.config = config
        self.workdir = workdir
        self.proc: asyncio.subprocess.Process | None = None
        self.scheduler = StandInScheduler(k.kubeconfig, interval=0.2)
        self.foreign = ForeignScheduler(k.kubeconfig)
        self.owners: dict[str, Owner] = {}
        self.partial_since: dict[str, float] = {}
        self.violations: list[Violation] = []
        self.restarts = 0
        self._tasks: list[asyncio.Task[None]] = []
        self.log = workdir / "placement.log"

    # --- the placement process --------------------------------------------------------------------

    async def start_placement(self) -> None:
        args = [
            sys.executable, "-m", "nodefabric_operator.console", "placement",
            "--kubeconfig", self.k.kubeconfig, "--config", str(self.config),
            "--namespace", "nodefabric", "--lease-duration", "2", "--metrics-port", "0",
            "--identity", f"placement-{self.restarts}",
        ]  # fmt: skip
        with open(self.log, "ab") as out:
            self.proc = await asyncio.create_subprocess_exec(*args, stdout=out, stderr=out)

    def leading(self) -> bool:
        """Whether the placement process this world started last is running and holds the Lease."""
        if self.proc is None or self.proc.returncode is not None:
            return False
        lease = self.k.api.stored("coordination.k8s.io/v1/leases", "nodefabric-placement", "nodefabric") or {}
        return (lease.get("spec") or {}).get("holderIdentity") == f"placement-{self.restarts}"

    async def kill_placement(self) -> None:
        """SIGKILL: no chance to hand the Lease over or finish what it was doing."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()
        self.restarts += 1

    async def stop_placement(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 15)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()

    # --- groups ---------------------------------------------------------------------------------------

    def own(self, group: str, size: int, *, label: tuple[str, str] | None = None) -> None:
        self.owners[group] = Owner(group, size, label or (GATE, group), declared=label is None)

    def create(self, group: str, index: int, **more: Any) -> None:
        """The owner creates pod `index` of the group (gated, as the webhook leaves it)."""
        owner = self.owners[group]
        pod = group_pod(
            group,
            index,
            owner.size if owner.declared else None,
            generation=owner.generations.get(index, 0),
            label=owner.label,
            **more,
        )
        job = self.k.api.stored("batch/v1/jobs", group, NS) if owner.label[0] == JOB_NAME else None
        if job is not None:  # a Job's pods carry its controller reference, as the Job controller sets it
            ref = {"apiVersion": "batch/v1", "kind": "Job", "name": group, "controller": True}
            pod["metadata"]["ownerReferences"] = [{**ref, "uid": job["metadata"]["uid"]}]
        self.k.api.put_object("v1/pods", pod)
        owner.current[index] = pod["metadata"]["name"]
        owner.extras[index] = more

    def members(self, group: str) -> list[dict[str, Any]]:
        """The owner's pods (pods of other schedulers carrying the same label are not its own)."""
        key, value = self.owners[group].label
        return [
            p
            for p in self.k.api.store.select("v1/pods", NS)
            if (p["metadata"].get("labels") or {}).get(key) == value
            and (p["spec"].get("schedulerName") or "default-scheduler") == "default-scheduler"
        ]

    def bound(self, group: str) -> int:
        return sum(1 for p in self.members(group) if (p.get("spec") or {}).get("nodeName"))

    def ready(self, group: str) -> int:
        return sum(1 for p in self.members(group) if (p.get("spec") or {}).get("nodeName") and is_ready(p))

    def placement_group(self, group: str) -> dict[str, Any] | None:
        for pg in self.k.api.store.select(PLACEMENT_GROUPS, NS):
            if pg.get("spec", {}).get("name") == group or pg.get("spec", {}).get("key", "").endswith(
                "/" + group
            ):
                return dict(pg)
        return None

    async def _recreate(self) -> None:
        """The owners' controller: a group's pod that is gone comes back, gated, under a new name."""
        while True:
            for owner in self.owners.values():
                for index, name in list(owner.current.items()):
                    if self.k.api.store.get("v1/pods", NS, name) is None:
                        owner.generations[index] = owner.generations.get(index, 0) + 1
                        owner.recreated += 1
                        self.create(owner.group, index, **owner.extras[index])
            await asyncio.sleep(0.2)

    async def _watchdog(self) -> None:
        """Partly bound (some of a group's pods on nodes, not all) for longer than the timeout, plus the
        time eviction and the scheduler take, is what must never happen. Only time with a placement process
        leading counts: killed, or starting while its predecessor's Lease runs out, none can time a group
        out (a start slowed by a loaded machine took 17 s once)."""
        slack = 4.0
        last = time.monotonic()
        while True:
            now = time.monotonic()
            if not self.leading():
                for group in self.partial_since:
                    self.partial_since[group] += now - last
            last = now
            for group, owner in self.owners.items():
                bound = self.bound(group)
                if 0 < bound < owner.size:
                    since = self.partial_since.setdefault(group, now)
                    if now - since > TIMEOUT_S + slack and not any(
                        v.group == group and v.since == since for v in self.violations
                    ):
                        self.violations.append(Violation(group, bound, owner.size, since, now - since))
                else:
                    self.partial_since.pop(group, None)
            await asyncio.sleep(0.1)

    async def until(self, predicate: Callable[[], bool], timeout: float = 45, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g} s waiting for {what}\n{self.describe()}")
            await asyncio.sleep(0.1)

    def describe(self) -> str:
        lines = []
        for group, owner in self.owners.items():
            pg = self.placement_group(group) or {}
            status = pg.get("status") or {}
            lines.append(
                f"{group}: {self.bound(group)}/{owner.size} bound, {self.ready(group)} ready, "
                f"phase {status.get('phase')}, decision {str(status.get('decision'))[:200]!r}"
            )
        with contextlib.suppress(OSError):
            lines.append(self.log.read_text()[-3000:])
        return "\n".join(lines)

    def whole_or_nothing(self) -> None:
        assert self.violations == [], (
            f"groups stayed partly bound past the timeout: {self.violations}\n{self.describe()}"
        )
        for group, owner in self.owners.items():
            assert self.bound(group) in (0, owner.size), f"{group} ends partly bound\n{self.describe()}"


def _phase(what: str) -> None:
    if os.environ.get("SCENARIO_PHASES"):
        print(f"{time.monotonic():.1f} {what}", flush=True)


@contextlib.asynccontextmanager
async def world(
    tmp_path: Path, nodes: list[dict[str, Any]], *, timeout_s: float = TIMEOUT_S, scheduling: bool = True
) -> AsyncIterator[World]:
    """The world, running; `scheduling=False` leaves the stand-in scheduler to the test to start."""
    config = tmp_path / "placement.yaml"
    config.write_text(yaml.safe_dump({"groupReadyTimeoutSeconds": timeout_s}))
    async with running_api(load_crds([str(CRD)]), directory=str(tmp_path)) as k:
        for name in ("nodefabric", NS):
            k.api.put_object("v1/namespaces", {"metadata": {"name": name}})
        for node in nodes:
            k.api.put_object("v1/nodes", node)
        w = World(k, config, tmp_path)
        await w.start_placement()
        if scheduling:
            w.scheduler.start()
        w._tasks = [asyncio.create_task(w._recreate()), asyncio.create_task(w._watchdog())]
        try:
            yield w
        finally:
            _phase("teardown")
            for task in w._tasks:
                task.cancel()
            for task in w._tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            _phase("tasks stopped")
            await w.scheduler.stop()
            _phase("scheduler stopped")
            await w.foreign.close()
            await w.stop_placement()
            _phase("placement stopped")
            if os.environ.get("SHOW_PLACEMENT_LOG"):
                print(w.log.read_text())
