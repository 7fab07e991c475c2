"""The long-running loop in-process: debounced triggers, backoff after a failed pass, prompt stop."""

from __future__ import annotations

import asyncio
import time

import pytest
from agent_fixtures import api_with_node, interface, make_agent, set_port, stored, two_nic_host, writes

from nodefabric_devicemanager.agent.uevents import UeventWatch
from nodefabric_devicemanager.testing.sysfs import Port


async def _until(predicate, timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def test_a_burst_of_triggers_is_one_pass(tmp_path):
    b = two_nic_host(tmp_path)
    async with api_with_node() as k:
        # The debounce must outlast every gap between the triggers below, even on a loaded machine.
        agent = make_agent(k, tmp_path, interval=3600, debounce=1.0)
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        await _until(lambda: agent.last_outcome is not None, what="the first pass")

        set_port(b, "0000:17:00.1", "mlx5_1", Port(state="DOWN", phys_state="Disabled"))
        for _ in range(5):  # e.g. a driver reload: several uevents within a moment
            agent.trigger()
            await asyncio.sleep(0.02)
        await _until(lambda: interface(stored(k), "ens1f1")["link"]["state"] == "failed", what="the pass")

        stop.set()
        await asyncio.wait_for(task, 5)
        assert agent.passes == 2, "the burst was coalesced into one pass"


async def test_a_failed_pass_is_retried_before_the_interval(tmp_path):
    two_nic_host(tmp_path)
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path, interval=3600, attempts=1)
        k.api.fail_next(2, 503)
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        try:
            await _until(lambda: agent.last_outcome is not None and agent.last_outcome.ok, what="a good pass")
            assert (agent.passes, len(writes(k))) == (3, 4), "two refused creates, then create + status"
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)


async def test_stop_interrupts_the_wait_for_the_next_pass(tmp_path):
    two_nic_host(tmp_path)
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path, interval=3600)
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        await _until(lambda: agent.passes == 1, what="the first pass")
        stop.set()
        await asyncio.wait_for(task, 5)
        assert task.done() and task.exception() is None


async def test_uevent_watch_calls_back_on_a_kernel_event_or_declines_cleanly():
    loop = asyncio.get_running_loop()
    seen = asyncio.Event()
    watch = UeventWatch(seen.set, subsystems=("net",))
    if not watch.start(loop):
        pytest.skip("netlink not permitted here: the agent runs on its periodic pass (logged once)")
    try:
        try:
            with open("/sys/class/net/lo/uevent", "w") as f:
                f.write("change")
        except OSError:
            pytest.skip("a read-only /sys: nothing can raise a kernel event on purpose")
        await asyncio.wait_for(seen.wait(), 5)
    finally:
        watch.stop(loop)
