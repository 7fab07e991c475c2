"""The operator stopped while a topology pass is writing: the pass runs in a worker thread that a cancel
does not end. Its write in flight is answered before the lease is released, and nothing more is sent."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import rest
from topology_fixtures import FABRIC, HOST, KAI, KUEUE, LEAF, VOLCANO, crd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
from operator_harness import NS, Client, writes

from nodefabric_devicemanager import crd as devices_crd
from nodefabric_operator import cli
from nodefabric_operator.demo.kubeapi import RunningAPI, running_api
from nodefabric_operator.topology import report
from nodefabric_operator.topology.shell import TopologyOptions

TARGETS = (
    "kueue.x-k8s.io/v1beta2/topologies",
    "kai.scheduler/v1alpha1/topologies",
    "topology.volcano.sh/v1alpha1/hypernodes",
    f"{report.GROUP}/{report.VERSION}/{report.PLURAL}",
)
GROUPS = ("kueue.x-k8s.io", "kai.scheduler", "topology.volcano.sh", report.GROUP)


def _lease_holder(k: RunningAPI) -> str | None:
    held = k.api.stored("coordination.k8s.io/v1/leases", "nodefabric-operator", NS) or {}
    return (held.get("spec") or {}).get("holderIdentity")


class FirstWriteHeld:
    """The API slow to answer the pass's first write: held (the request on its way) until opened; what
    the lease's holder was when it was answered is kept."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, k: RunningAPI) -> None:
        self.entered, self.open = threading.Event(), threading.Event()
        self.holder_at_answer: list[str | None] = []
        original = rest.RESTClientObject.request
        lock, taken = threading.Lock(), [False]

        def held(this: Any, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            with lock:
                first = method in ("POST", "PATCH", "DELETE") and any(g in url for g in GROUPS)
                first, taken[0] = first and not taken[0], taken[0] or first
            if not first:
                return original(this, method, url, *args, **kwargs)
            self.entered.set()
            assert self.open.wait(60)
            try:
                return original(this, method, url, *args, **kwargs)
            finally:
                self.holder_at_answer.append(_lease_holder(k))

        monkeypatch.setattr(rest.RESTClientObject, "request", held)


async def test_a_pass_writing_when_the_operator_stops_ends_after_its_write_and_before_the_release(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    crds = [devices_crd.devices_crd(), crd(KUEUE), crd(KAI), crd(VOLCANO), report.crd()]
    async with running_api(crds) as k:
        c = Client(k.kubeconfig)
        for n in range(3):
            await c.node(f"gpu-{n}", {HOST: f"gpu-{n}", LEAF: f"leaf-{n % 2}", FABRIC: "nvl-a"})
        gate = FirstWriteHeld(monkeypatch, k)
        opts = cli.Options(
            sink="node",
            namespace=NS,
            kubeconfig=k.kubeconfig,
            backoffs=(0.05,),
            topology=TopologyOptions(debounce=0.05),
            leader_elect=True,
            lease_timing=(30, 20, 0.1),
        )
        stop, failure = threading.Event(), list[BaseException]()

        def main() -> None:
            try:
                asyncio.run(cli.serve(opts, stop_flag=stop))
            except BaseException as err:
                failure.append(err)

        thread = threading.Thread(target=main, name="operator", daemon=True)
        thread.start()
        try:
            assert await asyncio.to_thread(gate.entered.wait, 60), "the pass wrote nothing"
            assert _lease_holder(k)
            stop.set()
            deadline = time.monotonic() + 7  # past kopf's five seconds for tasks it did not start
            while time.monotonic() < deadline and _lease_holder(k):
                await asyncio.sleep(0.1)
            held_while_writing = _lease_holder(k) is not None
        finally:
            gate.open.set()
            await asyncio.to_thread(thread.join, 60)
        assert not thread.is_alive() and not failure, failure
        assert held_while_writing, "the lease was released while a topology write was in flight"
        assert gate.holder_at_answer and gate.holder_at_answer[0] is not None
        assert _lease_holder(k) is None
        # The held write landed; nothing of the rest of the pass was sent after the stop.
        assert sum(writes(k, key) for key in TARGETS) == 1
