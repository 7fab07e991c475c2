"""The record source: latest record, change notification across threads, standalone host polling."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest
from dp_helpers import nic, scripted_reader, two_nics_and_vfs

from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import DevicesSpec, Interface
from nodefabric_deviceplugin.source import RecordSource, poll_host


async def test_update_wakes_waiters_only_on_change() -> None:
    source = RecordSource()
    assert source.spec is None and source.version == 0
    waiter = asyncio.create_task(source.changed(0))
    await asyncio.sleep(0)
    assert source.update(two_nics_and_vfs())
    assert await asyncio.wait_for(waiter, 30) == 1
    assert not source.update(two_nics_and_vfs())
    assert source.version == 1
    second = asyncio.create_task(source.changed(1))
    await asyncio.sleep(0.01)
    assert not second.done()
    second.cancel()


async def test_update_from_another_thread() -> None:
    source = RecordSource(DevicesSpec())
    waiter = asyncio.create_task(source.changed(source.version))
    await asyncio.sleep(0)
    thread = threading.Thread(target=source.update, args=(two_nics_and_vfs(),))
    thread.start()
    assert await asyncio.wait_for(waiter, 30) == 2
    thread.join()


async def test_first_waits_for_a_record() -> None:
    source = RecordSource()
    first = asyncio.create_task(source.first())
    await asyncio.sleep(0)
    assert not first.done()
    source.update(DevicesSpec())
    assert await asyncio.wait_for(first, 30) == DevicesSpec()


async def test_poll_keeps_the_last_record_when_enumeration_fails() -> None:
    readings: list[list[Interface] | Exception | None] = [
        [nic("ens1f0", "0000:19:00.0", "mlx5_0")],
        None,
        RuntimeError("sysfs vanished"),
        [],
    ]
    seen: list[DevicesSpec | None] = []
    source = RecordSource()
    stop = asyncio.Event()
    reader = scripted_reader(readings, stop)

    async def record() -> None:
        version = 0
        while not stop.is_set():
            version = await source.changed(version)
            seen.append(source.spec)

    recorder = asyncio.create_task(record())
    await asyncio.wait_for(poll_host(source, HostRoot.at("/"), interval=0.001, reader=reader, stop=stop), 30)
    await asyncio.sleep(0)
    recorder.cancel()
    # One reading, two failures that change nothing, then a pass that really found no interfaces.
    assert [None if s is None else len(s.interfaces) for s in seen] == [1, 0]
    assert source.spec == DevicesSpec(interfaces=[])


async def test_a_host_read_that_raises_is_one_error_line(caplog: pytest.LogCaptureFixture) -> None:
    readings: list[list[Interface] | Exception] = [RuntimeError("sysfs vanished"), [nic("e", "0000:19:00.0")]]
    stop = asyncio.Event()
    reader = scripted_reader(readings, stop)

    caplog.set_level(logging.INFO, logger="nodefabric_deviceplugin")
    await asyncio.wait_for(
        poll_host(RecordSource(), HostRoot.at("/"), interval=0.001, reader=reader, stop=stop), 5
    )
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == ["reading the host failed; serving the last record"]
    assert errors[0].exc_info is not None, "the traceback says what failed"
