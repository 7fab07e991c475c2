"""The one host read with a deadline (`hostpoll`): what the agent and both standalone readers share."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from nodefabric_devicemanager import hostpoll

log = logging.getLogger("test.hostpoll")


async def test_a_read_past_its_deadline_is_overdue_and_the_next_fails_at_once_without_a_thread():
    release = threading.Event()
    calls = 0

    def stuck() -> str:
        nonlocal calls
        calls += 1
        release.wait(30)
        return "late"

    reads = hostpoll.HostReads(deadline=0.1)
    try:
        with pytest.raises(hostpoll.Overdue, match=r"did not finish within 0\.1s"):
            await reads.read(stuck)
        assert reads.stuck_for() > 0
        started = time.monotonic()
        with pytest.raises(hostpoll.Overdue, match="still stuck"):
            await reads.read(stuck)
        assert time.monotonic() - started < 0.05 and calls == 1
    finally:
        release.set()
    deadline = time.monotonic() + 5
    while reads.stuck_for():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    assert await reads.read(lambda: "fresh") == "fresh"


async def test_poll_feeds_readings_logs_failures_and_a_recovery(caplog: pytest.LogCaptureFixture):
    release = threading.Event()
    script: list[object] = [1, RuntimeError("sysfs vanished"), "stuck", 2]
    fed: list[object] = []
    stop = asyncio.Event()

    def read() -> object:
        step = script.pop(0) if script else None
        if step is None:
            stop_soon()
            return 3
        if isinstance(step, Exception):
            raise step
        if step == "stuck":
            release.wait(30)
            return "late"
        return step

    loop = asyncio.get_running_loop()

    def stop_soon() -> None:
        loop.call_soon_threadsafe(stop.set)

    caplog.set_level(logging.INFO, logger="test.hostpoll")

    async def unstick() -> None:
        while not any("taking too long" in r.getMessage() for r in caplog.records):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # several intervals while stuck: reported once
        release.set()

    helper = asyncio.create_task(unstick())
    await asyncio.wait_for(
        hostpoll.poll(read, fed.append, root="/host", interval=0.01, stop=stop, log=log, deadline=0.1), 10
    )
    helper.cancel()
    release.set()
    # "late" (the stuck read's own answer) is never fed: its caller gave up on it at the deadline.
    assert fed[0] == 1 and "late" not in fed and 2 in fed
    messages = [r.getMessage() for r in caplog.records if r.name == "test.hostpoll"]
    assert messages.count("reading the host failed; serving the last record") == 1
    assert messages.count("reading the host is taking too long; serving the last record") == 1
    assert messages.count("the host is read again") == 1
    failed = next(r for r in caplog.records if r.getMessage().startswith("reading the host failed"))
    assert failed.exc_info is not None and getattr(failed, "root", "") == "/host"


async def test_stop_is_never_kept_waiting_by_a_stuck_read():
    release = threading.Event()
    stop = asyncio.Event()
    task = asyncio.create_task(
        hostpoll.poll(lambda: release.wait(30), lambda _: None, root="/", interval=1, stop=stop, log=log)
    )
    await asyncio.sleep(0.1)
    started = time.monotonic()
    stop.set()
    try:
        await asyncio.wait_for(task, 5)
        assert time.monotonic() - started < 1
    finally:
        release.set()


async def test_a_reading_the_feed_refuses_is_logged_and_the_poll_goes_on(caplog: pytest.LogCaptureFixture):
    # A reader that returns garbage (a record the source's model refuses): that reading is lost, logged,
    # and the next one is fed; the poll (and the last record it served) does not end with it.
    readings: list[object] = [1, "garbage", 2]
    fed: list[object] = []
    stop = asyncio.Event()

    def read() -> object:
        return readings.pop(0) if readings else 3

    def feed(reading: object) -> None:
        if not isinstance(reading, int):
            raise ValueError(f"not a reading: {reading!r}")
        fed.append(reading)
        if reading == 3:
            stop.set()

    caplog.set_level(logging.INFO, logger="test.hostpoll")
    await asyncio.wait_for(
        hostpoll.poll(read, feed, root="/host", interval=0.01, stop=stop, log=log, deadline=5), 10
    )
    assert fed == [1, 2, 3]
    refused = [
        r for r in caplog.records if r.getMessage() == "a host reading was refused; serving the last record"
    ]
    assert len(refused) == 1 and refused[0].exc_info is not None


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "30", None, True])
async def test_a_deadline_that_is_no_deadline_is_refused_by_name(bad: object):
    # 0 or less failed every read at once (the host never read); NaN or infinity waited on a stuck read
    # forever. Refused where it is given, the constructor or one read.
    with pytest.raises(ValueError, match="deadline must be"):
        hostpoll.HostReads(bad)  # type: ignore[arg-type]
    reads = hostpoll.HostReads(5.0)
    if bad is not None:  # a read's None is "the reader's own deadline"
        with pytest.raises(ValueError, match="deadline must be"):
            await reads.read(lambda: 1, deadline=bad)  # type: ignore[arg-type]
    assert await reads.read(lambda: 1) == 1


@pytest.mark.parametrize("ends", ["returns", "raises"])
async def test_serve_beside_stops_and_waits_for_the_poll_however_the_server_ends(ends: str):
    stop = asyncio.Event()
    reads: list[float] = []
    poll_ended = asyncio.Event()

    async def polling() -> None:
        try:
            await hostpoll.poll(time.monotonic, reads.append, root="/h", interval=0.01, stop=stop, log=log)
        finally:
            poll_ended.set()

    async def serving() -> str:
        while len(reads) < 2:
            await asyncio.sleep(0.01)
        if ends == "raises":
            raise OSError("the socket went away")
        return "served"

    if ends == "raises":
        with pytest.raises(OSError, match="socket went away"):
            await asyncio.wait_for(hostpoll.serve_beside(polling(), serving(), stop), 10)
    else:
        assert await asyncio.wait_for(hostpoll.serve_beside(polling(), serving(), stop), 10) == "served"
    assert stop.is_set() and poll_ended.is_set()  # stopped, and waited for: nothing reads on after it
