"""Churn, through the real processes (the world of test_admission_scenarios): groups of mixed sizes,
more than the fleet holds, their pods created in a shuffled interleaving; a foreign scheduler taking
nodes while groups are admitted; the placement process killed once it admitted a group and started
again; a bound group
finishing so that a waiting one fits. Seeded, so a failure replays the same order (the processes'
timing aside). Whatever happens, the rules every group is held to:
- never partly bound past the timeout (the world's watchdog), and whole or nothing once it settles;
- no node holds more GPUs than it has, foreign pods included;
- once it settles, a group not bound waits whole behind its gates: none of its pods let through alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from scenario_world import GPU, NS, TIMEOUT_S, World, gpu_node, world

pytestmark = pytest.mark.timeout(300)

GPUS_PER_NODE = 8


def _fleet() -> list[dict[str, Any]]:
    return [gpu_node(f"n{i:02d}", f"z{i % 2}") for i in range(16)]


def _gpus(pod: dict[str, Any]) -> int:
    return sum(
        int((c.get("resources") or {}).get("requests", {}).get(GPU, 0))
        for c in pod["spec"].get("containers", [])
    )


def _per_node(w: World) -> Counter[str]:
    held: Counter[str] = Counter()
    for pod in w.k.api.store.select("v1/pods"):
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            held[node] += _gpus(pod)
    return held


def _gated(w: World, group: str) -> int:
    return sum(1 for p in w.members(group) if p["spec"].get("schedulingGates"))


def _settled(w: World) -> bool:
    """Every group whole and Ready, or waiting whole: every pod of it gated, none bound."""
    for group, owner in w.owners.items():
        whole = w.ready(group) == owner.size == len(w.members(group))
        waiting = w.bound(group) == 0 and _gated(w, group) == owner.size == len(w.members(group))
        if not (whole or waiting):
            return False
    return True


def _assigned(w: World) -> set[str]:
    """The nodes some PlacementGroup assigns a member to."""
    found: set[str] = set()
    for group in w.owners:
        members = ((w.placement_group(group) or {}).get("status") or {}).get("members") or []
        found.update(m["node"] for m in members if m.get("node"))
    return found


async def _take(w: World, rng: random.Random, name: str, gpus: str) -> None:
    """The foreign scheduler takes a node no pod holds and no group is assigned: it binds without a
    look (the embedded API has no kubelet to refuse a pod that does not fit), so a node a group's pod
    holds would be overcommitted by the test itself, not by the placement."""
    held, assigned = _per_node(w), _assigned(w)
    free = [node["metadata"]["name"] for node in _fleet()]
    node = rng.choice([n for n in free if not held[n] and n not in assigned])
    await w.foreign.take(node, namespace="other", name=name, requests={GPU: gpus})


async def _restart(w: World) -> None:
    await w.kill_placement()
    await w.start_placement()


def _no_node_overcommitted(w: World) -> None:
    over = {node: gpus for node, gpus in _per_node(w).items() if gpus > GPUS_PER_NODE}
    assert not over, f"nodes holding more GPUs than they have: {over}\n{w.describe()}"


async def _watch_capacity(w: World, seen: list[dict[str, int]]) -> None:
    while True:
        over = {node: gpus for node, gpus in _per_node(w).items() if gpus > GPUS_PER_NODE}
        if over:
            seen.append(over)
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("seed", [7, 1234])
async def test_churn_keeps_every_group_whole_or_waiting(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    sizes = {"a": 8, "b": 4, "c": 4, "d": 2, "e": 8, "f": 2}  # 28 nodes' worth on a fleet of 16
    async with world(tmp_path, _fleet()) as w:
        overcommitted: list[dict[str, int]] = []
        capacity = asyncio.create_task(_watch_capacity(w, overcommitted))
        try:
            for group, size in sizes.items():
                w.own(group, size)
            order = [(g, i) for g, size in sizes.items() for i in range(size)]
            rng.shuffle(order)
            # The churn meets a running placement (its start takes longer than creating every pod), and
            # it is killed once it has admitted a group, not before it ever led.
            await w.until(w.leading, what="the placement leading")
            restarted = False
            for step, (group, index) in enumerate(order):
                w.create(group, index)
                if step == len(order) // 3:
                    await _take(w, rng, "foreign-0", "8")
                if not restarted and step >= len(order) // 2 and any(w.bound(g) for g in w.owners):
                    await _restart(w)
                    restarted = True
                if step == 2 * len(order) // 3:
                    await _take(w, rng, "foreign-1", "4")
                await asyncio.sleep(rng.uniform(0, 0.15))
            if not restarted:
                await w.until(lambda: any(w.bound(g) for g in w.owners), what="a group admitted")
                await _restart(w)
            await w.until(lambda: any(w.ready(g) == s for g, s in sizes.items()), what="a whole group")
            await w.until(lambda: _settled(w), timeout=TIMEOUT_S + 60, what="every group whole or waiting")
            w.whole_or_nothing()
            _no_node_overcommitted(w)

            # The bound groups finish: their pods go for good (their owners make no more). The nodes
            # they held are free, and waiting groups that now fit are admitted, whole.
            done = [g for g in w.owners if w.ready(g) == sizes[g]]
            for group in done:
                for pod in w.members(group):
                    w.k.api.remove_object("v1/pods", pod["metadata"]["name"], NS)
                del w.owners[group]
            await w.until(
                lambda: _settled(w) and any(w.ready(g) == sizes[g] for g in w.owners),
                timeout=TIMEOUT_S + 60,
                what=f"a waiting group admitted once {', '.join(done)} finished",
            )
            await asyncio.sleep(TIMEOUT_S + 2)  # past the timeout: still whole or waiting
            assert _settled(w), w.describe()
            w.whole_or_nothing()
            _no_node_overcommitted(w)
            assert overcommitted == [], (
                f"a node held more GPUs than it has at some moment: {overcommitted[:3]}"
            )
        finally:
            capacity.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await capacity
