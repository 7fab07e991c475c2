"""Seeded churn with the controller's passes run one at a time: after each change made through the
embedded API, the watches are let deliver everything (the tables match the API's store) before one pass
runs. So a run is the same sequence of passes over the same states whatever the machine's speed, and two
runs of one seed (under two rules for when a waiting group is decided again) can be compared decision
by decision. Used by test_admission_fresh.py and hack/bench_admission.py."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from admission_world import GATE, NS, World, gpod
from kubernetes import client

from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_operator.admission import model, podview
from nodefabric_operator.admission.controller import Controller
from nodefabric_operator.demo.kubeapi import RunningAPI
from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.extender.nodes import parse_node

PODS = "v1/pods"
NODES = "v1/nodes"
PGS = f"{model.API_VERSION}/{model.PLURAL}"
BASE = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
DECISIONS = "nodefabric_placement_decisions_total"


class FakeClock:
    """The controller's clock, moved on by the driver only: owners' counts are read again (after
    SIZE_TTL_S) at the same passes in every run."""

    def __init__(self) -> None:
        self.now = BASE

    def __call__(self) -> float:
        return self.now


@dataclass
class Pass:
    """What one pass cost: the admission rules it ran and its wall time."""

    decisions: int
    seconds: float


@dataclass
class Driver:
    k: RunningAPI
    w: World
    ctl: Controller
    clock: FakeClock
    created: int = 0  # pods made so far: each is a second older than the next
    passes: list[Pass] = field(default_factory=list)

    def decisions(self) -> int:
        return int(self.ctl.metrics.registry.get_sample_value(DECISIONS) or 0)

    def caught_up(self) -> bool:
        """The controller's tables hold what the API holds: every pod and PlacementGroup, as stored."""
        store = self.k.api.store
        pods = {podview.uid(p): podview.rv(p) for p in store.select(PODS)}
        if pods != {uid: podview.rv(p) for uid, p in self.ctl.tables.pods.items()}:
            return False
        pgs = {(p["metadata"]["namespace"], p["metadata"]["name"]): podview.rv(p) for p in store.select(PGS)}
        return pgs == {key: podview.rv(p) for key, p in self.ctl.tables.pgs.items()}

    async def settle(self) -> None:
        await self.ctl.publisher.drain()  # the decisions copied onto pods: landed before the next pass
        deadline = time.monotonic() + 30
        while not self.caught_up():
            if time.monotonic() > deadline:
                raise AssertionError("the watches did not deliver what the API holds within 30 s")
            await asyncio.sleep(0.005)

    async def step(self) -> None:
        """One pass once everything made so far is delivered, then its own writes delivered too."""
        await self.settle()
        self.clock.now += 1.0
        before, started = self.decisions(), time.perf_counter()
        await self.ctl.reconcile_all()
        self.passes.append(Pass(self.decisions() - before, time.perf_counter() - started))
        await self.settle()

    async def put_node(self, node: dict[str, Any]) -> None:
        """Made or replaced through the API, and waited for until the controller's tables hold it as
        given (caught_up does not look at nodes)."""
        self.k.api.put_object(NODES, node)
        record = parse_node(copy.deepcopy(node))
        cordoned = (node.get("spec") or {}).get("unschedulable") is True
        deadline = time.monotonic() + 30
        tables = self.ctl.tables
        while tables.cache.nodes.get(record.name) != record or (record.name in tables.cordoned) != cordoned:
            if time.monotonic() > deadline:
                raise AssertionError(f"node {record.name} not delivered within 30 s")
            await asyncio.sleep(0.005)

    def put_pod(self, pod: dict[str, Any]) -> None:
        """Made through the API with a creation time of its own (one second after the last pod's), so
        the groups' order (oldest first) is the same in every run."""
        self.created += 1
        stamp = datetime.fromtimestamp(BASE + self.created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        pod["metadata"]["creationTimestamp"] = stamp
        self.k.api.put_object(PODS, pod)

    def remove_pod(self, name: str, namespace: str = NS) -> None:
        self.k.api.remove_object(PODS, name, namespace)

    async def bind_released(self) -> None:
        """What kube-scheduler and the kubelet do: each pod our gate left, pinned, bound there and Ready."""
        for pod in list(self.k.api.store.select(PODS, NS)):
            name = pod["metadata"]["name"]
            if pod["spec"].get("nodeName") or pod["spec"].get("schedulingGates"):
                continue
            if self.w.pinned(name):
                await self.w.bind_and_ready(name)

    def outcome(self) -> dict[str, tuple[str, int, tuple[tuple[str, str], ...]]]:
        """Each group as its PlacementGroup says: phase, attempts and every member's node."""
        out = {}
        for pg in self.k.api.store.select(PGS):
            status = pg.get("status") or {}
            members = tuple((m["pod"], m.get("node", "")) for m in status.get("members") or [])
            out[pg["spec"]["key"]] = (status.get("phase", ""), status.get("attempts", 0), members)
        return out


@contextlib.asynccontextmanager
async def driven(k: RunningAPI, w: World, *, every_event: bool) -> AsyncIterator[Driver]:
    """The controller with its watches running and its passes left to the driver."""
    api: client.ApiClient = load_client(k.kubeconfig)
    clock = FakeClock()
    ctl = Controller(ExtenderConfig(), api, clock=clock, every_event=every_event)
    ctl.watcher.start(asyncio.get_running_loop())
    try:
        deadline = time.monotonic() + 30
        while not ctl.cache.synced:
            if time.monotonic() > deadline:
                raise AssertionError("caches not synced")
            await asyncio.sleep(0.01)
        yield Driver(k, w, ctl, clock)
    finally:
        ctl.watcher.stop()
        await ctl.publisher.drain()


def group_pod(group: str, index: int, size: int) -> dict[str, Any]:
    """Pod `index` of an explicit group of `size` pods of 8 GPUs, gated as the webhook leaves it."""
    return gpod(
        f"{group}-{index}", labels={GATE: group}, annotations={"placement.gpustack.ai/group-size": str(size)}
    )


def bystander(name: str, value: str) -> dict[str, Any]:
    """A pod of no group that never binds: a change to it is a watch event that concerns no group."""
    pod = gpod(name, gated=False, gpus=0, scheduler="nobody")
    pod["metadata"]["labels"] = {"churn": value}
    return pod


async def seeded_churn(d: Driver, seed: int, steps: int, sizes: dict[str, int]) -> list[Any]:
    """Groups of `sizes` created pod by pod in a shuffled interleaving, mixed with changes that concern
    no group, foreign pods bound straight to nodes (and gone again), the released pods bound, and bound
    groups finishing (their pods gone). Returns the outcome after every pass."""
    rng = random.Random(seed)
    order = [(g, i) for g, size in sizes.items() for i in range(size)]
    rng.shuffle(order)
    trace: list[Any] = []
    foreign: list[str] = []
    d.put_pod(bystander("bystander", "0"))
    for step in range(steps):
        roll = rng.random()
        if order and roll < 0.35:
            group, index = order.pop()
            d.put_pod(group_pod(group, index, sizes[group]))
        elif roll < 0.55:
            pod = bystander("bystander", str(step))
            d.k.api.put_object(PODS, {**pod, "metadata": {**pod["metadata"], "name": "bystander"}})
        elif roll < 0.65 and len(foreign) < 2:
            name = f"foreign-{step}"
            pod = gpod(name, gated=False, gpus=8, scheduler="foreign")
            pod["spec"]["nodeName"] = rng.choice(sorted(d.ctl.cache.nodes))
            d.put_pod(pod)
            foreign.append(name)
        elif roll < 0.75 and foreign:
            d.remove_pod(foreign.pop(0))
        elif roll < 0.85:
            await d.bind_released()
        else:
            bound = sorted(k for k, (phase, _a, _m) in d.outcome().items() if phase == "Bound")
            if bound:
                for name, _node in d.outcome()[rng.choice(bound)][2]:
                    d.remove_pod(name)
        await d.step()
        trace.append(d.outcome())
    return trace
