"""The DRA driver's standalone reader (`nodefabric draplugin` without an agent): a failed read keeps what
is recorded by the agent's own rule (`inventory.keep_recorded`), and reads go through the one host poll
with its deadline."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from datetime import UTC, datetime

import pytest

from nodefabric_devicemanager import inventory
from nodefabric_devicemanager.agent import publish
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import (
    ACCELERATORS_ENUMERATED,
    Accelerator,
    AcceleratorGroup,
    Condition,
    DevicesSpec,
    Interface,
)
from nodefabric_deviceplugin.dra.standalone import poll_record, record
from nodefabric_deviceplugin.source import RecordSource

NIC = Interface(name="ens1f0", pci_bus_id="0000:19:00.0", rdma_device="mlx5_0")


def group(key: str, manufacturer: str, count: int) -> AcceleratorGroup:
    accelerators = [Accelerator(id=f"{key}-{i}", index=i) for i in range(count)]
    return AcceleratorGroup(id=key, manufacturer=manufacturer, accelerators=accelerators)


def not_enumerated() -> inventory.Reading:
    """No /sys/bus/pci: interfaces read, accelerators not enumerated at all, no manufacturer named."""
    return inventory.Reading(
        interfaces=[NIC],
        conditions=[
            Condition(type=ACCELERATORS_ENUMERATED, status="False", reason="PciBusAbsent", message="x")
        ],
    )


def test_accelerators_not_enumerated_at_all_keep_every_recorded_group() -> None:
    last = DevicesSpec(interfaces=[NIC], groups=[group("nvidia", "NVIDIA", 8), group("ascend", "Huawei", 2)])
    spec = record(not_enumerated(), last)
    assert spec is not None
    assert [g.id for g in spec.groups] == ["ascend", "nvidia"]
    assert [len(g.accelerators) for g in spec.groups] == [2, 8]


def test_groups_are_sorted_by_manufacturer_then_id() -> None:
    # Sorted by id alone (the old standalone rule) this would be amd, zeta; the agent sorts by manufacturer.
    reading = inventory.Reading(interfaces=[NIC], groups=[group("zeta", "AMD", 1), group("amd", "Zeta", 1)])
    spec = record(reading, None)
    assert spec is not None and [g.id for g in spec.groups] == ["zeta", "amd"]


@pytest.mark.parametrize(
    "reading",
    [
        not_enumerated(),
        inventory.Reading(interfaces=None, failed_manufacturers={"nvidia"}),
        inventory.Reading(interfaces=[], groups=[group("amd", "AMD", 1)], failed_manufacturers={"nvidia"}),
        inventory.Reading(interfaces=[NIC], groups=[group("nvidia", "NVIDIA", 4)]),
    ],
    ids=["accelerators-unread", "interfaces-unread", "one-manufacturer-failed", "all-read"],
)
def test_the_standalone_record_is_the_agents(reading: inventory.Reading) -> None:
    last = DevicesSpec(interfaces=[NIC], groups=[group("nvidia", "NVIDIA", 8), group("ascend", "Huawei", 2)])
    agent = publish.desired_spec(reading, last, datetime.now(UTC))
    assert record(reading, last) == agent


def test_nothing_to_serve_before_interfaces_were_ever_read() -> None:
    assert record(inventory.Reading(interfaces=None), None) is None


async def test_a_stuck_read_keeps_the_record_and_never_holds_up_stop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = threading.Event()
    calls = 0

    def reader(host: HostRoot) -> inventory.Reading:
        nonlocal calls
        calls += 1
        if calls == 1:
            return inventory.Reading(interfaces=[NIC], groups=[group("nvidia", "NVIDIA", 8)])
        release.wait(30)  # stuck, as on a FIFO where a sysfs attribute should be
        return not_enumerated()

    source, stop = RecordSource(), asyncio.Event()
    caplog.set_level(logging.INFO)
    task = asyncio.create_task(
        poll_record(source, HostRoot.at("/"), interval=0.01, stop=stop, reader=reader, deadline=0.2)
    )
    try:
        deadline = time.monotonic() + 10
        while not any("taking too long" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "the stuck read was never reported"
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # several more intervals while it stays stuck
        assert source.spec is not None and [g.id for g in source.spec.groups] == ["nvidia"]
        assert calls == 2, "no second thread is started while the first read is stuck"
        stuck = [r for r in caplog.records if "taking too long" in r.getMessage()]
        assert len(stuck) == 1, "a read that stays stuck is reported once"
        started = time.monotonic()
        stop.set()
        await asyncio.wait_for(task, 5)
        assert time.monotonic() - started < 1
    finally:
        release.set()
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
