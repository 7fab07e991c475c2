"""Conditions through the real agent and the embedded API: duplicates merged once, firstSeenTime is when
a pass saw the failure, unread is not empty, and a missing NVML is told once (log line and Event)."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

import pynvml
from agent_fixtures import (
    DEVICES,
    NODE,
    api_with_node,
    break_interface_enumeration,
    conditions,
    interface,
    make_agent,
    restore_interface_enumeration,
    set_port,
    stored,
    two_nic_host,
    writes,
)

from nodefabric_devicemanager import inventory
from nodefabric_devicemanager.accelerators import Libraries
from nodefabric_devicemanager.accelerators.nvidia import Nvml
from nodefabric_devicemanager.agent.core import Result
from nodefabric_devicemanager.testing.accelerators import FakeNvml, nvswitch_node
from nodefabric_devicemanager.testing.sysfs import Port, SysfsBuilder

EVENTS = "v1/events"
NAMESPACES = "v1/namespaces"


async def test_duplicate_conditions_are_merged_once_then_nothing_is_written(tmp_path):
    two_nic_host(tmp_path)
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path)
        await agent.run_pass()
        # A record that repeats one of ours (with another status) and one of the operator's. The API
        # server refuses such a write today (conditions are a list-map keyed by type); a record stored
        # under the older schema, which had no list-map keys, can still hold it.
        obj = stored(k)
        ours = conditions(obj)["InterfacesEnumerated"]
        theirs = {
            "type": "LabelsPublished",
            "status": "True",
            "reason": "Published",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
        obj["status"]["conditions"] = [
            ours,
            {**ours, "status": "False"},
            theirs,
            {**theirs, "reason": "Other"},
        ]
        k.api.put_object(DEVICES, obj, validate=False)

        fresh = make_agent(k, tmp_path)  # the edit happened while no agent watched: a restart sees it
        assert (await fresh.run_pass()).wrote == ("status",)
        after = stored(k)["status"]["conditions"]
        assert [c["type"] for c in after] == [
            "AcceleratorsEnumerated",
            "InterfacesEnumerated",
            "LabelsPublished",
            "Ready",
        ]
        assert conditions(stored(k))["InterfacesEnumerated"] == ours, "the first entry kept, time and all"
        assert conditions(stored(k))["LabelsPublished"] == theirs
        before = len(writes(k))
        for a in (fresh, make_agent(k, tmp_path)):
            assert (await a.run_pass()).wrote == ()
        assert len(writes(k)) == before, "the steady state is zero writes again"


async def test_first_seen_time_is_when_a_pass_saw_the_failure_not_when_the_write_got_through(tmp_path):
    b = two_nic_host(tmp_path)
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path, attempts=2)
        await agent.run_pass()
        set_port(b, "0000:17:00.1", "mlx5_1", Port(state="DOWN", phys_state="Disabled"))
        seen_by = datetime.now(UTC).replace(microsecond=0)
        k.api.fail_next(2, 503)  # the API is down while the failure is first observed
        assert (await agent.run_pass()).result is Result.FAILED
        # The API keeps times to the second: let the clock move well past the observation.
        await asyncio.sleep(2.1)
        written_at = datetime.now(UTC).replace(microsecond=0)
        assert (await agent.run_pass()).wrote == ("spec", "status")  # the verdict, then the FAILED count
        first_seen = datetime.fromisoformat(interface(stored(k), "ens1f1")["link"]["firstSeenTime"])
        assert seen_by <= first_seen < written_at


async def test_accelerators_and_interfaces_unread_keep_the_recorded_parts(tmp_path):
    b = SysfsBuilder(tmp_path)
    nvml = nvswitch_node(
        b, cluster_uuid=bytes.fromhex("5b0e112233445566778899aabbccddef"), clique_id=1,
        state=pynvml.NVML_GPU_FABRIC_STATE_COMPLETED,
    )  # fmt: skip
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path)
        agent.reader = lambda host: inventory.read(host, libraries=Libraries(nvidia=Nvml(nvml)))
        assert (await agent.run_pass()).result is Result.CREATED
        recorded = stored(k)["spec"]
        assert recorded["groups"] and recorded["groups"][0]["accelerators"]

        # The bus cannot be read: its directory is a link out of the host root, which is refused.
        devices = tmp_path / "sys/bus/pci/devices"
        devices.rename(tmp_path / "sys/bus/pci/devices.saved")
        devices.symlink_to("/proc")
        outcome = await agent.run_pass()
        assert "spec" not in outcome.wrote, "unread is not empty: nothing recorded is dropped"
        assert stored(k)["spec"] == recorded
        assert conditions(stored(k))["AcceleratorsEnumerated"]["status"] == "False"
        assert conditions(stored(k))["InterfacesEnumerated"]["status"] == "False"


def _nvidia_without_nvml(tmp_path):
    b = SysfsBuilder(tmp_path)
    nvswitch_node(b, cluster_uuid=bytes(16), clique_id=0, state=pynvml.NVML_GPU_FABRIC_STATE_COMPLETED)
    missing = Nvml(FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    return lambda host: inventory.read(host, libraries=Libraries(nvidia=missing))


async def test_nvml_missing_is_one_warning_and_one_event_with_the_remedy(tmp_path, caplog):
    reader = _nvidia_without_nvml(tmp_path)
    caplog.set_level(logging.INFO)
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path)
        agent.reader = reader
        for _ in range(3):
            assert (await agent.run_pass()).ok
        cond = conditions(stored(k))["NvidiaFabricRead"]
        assert cond["status"] == "False" and cond["reason"] == "LibraryUnavailable"

        told = [r for r in caplog.records if getattr(r, "condition", "") == "NvidiaFabricRead"]
        assert [r.levelno for r in told] == [logging.WARNING], "one warning, not one per pass"
        assert "runtimeClassName=nvidia" in told[0].detail and "--driver-root" in told[0].detail

        posted = k.requests("POST", EVENTS)
        assert len(posted) == 1
        event = posted[0].data
        assert event["type"] == "Warning" and event["reason"] == "LibraryUnavailable"
        assert event["involvedObject"]["kind"] == "Devices" and event["involvedObject"]["name"] == NODE
        assert event["involvedObject"]["uid"] == stored(k)["metadata"]["uid"]
        assert (
            event["source"]["component"] == "nodefabric-agent"
            and event["reportingComponent"] == "nodefabric-agent"
        )
        assert "runtimeClassName=nvidia" in event["message"]

        restarted = make_agent(k, tmp_path)
        restarted.reader = reader
        assert (await restarted.run_pass()).wrote == ()
        assert len(k.requests("POST", EVENTS)) == 2, "told again after a restart, and only then"


async def test_a_flapping_condition_posts_a_bounded_number_of_events(tmp_path):
    """Interfaces that cannot be listed every other pass: each change is news, but the record's Events
    are client-go's budget (25 at once, then one per 5 minutes), not one per flap; the rest are counted."""
    two_nic_host(tmp_path)
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path)
        assert (await agent.run_pass()).result is Result.CREATED
        now = [0.0]
        agent.spam_clock = lambda: now[0]
        for _ in range(20):
            break_interface_enumeration(tmp_path)
            await agent.run_pass()
            restore_interface_enumeration(tmp_path)
            await agent.run_pass()
        # The record follows every flap; the Events stop at the budget.
        assert conditions(stored(k))["InterfacesEnumerated"]["status"] == "True"
        types = [r.data["type"] for r in k.requests("POST", EVENTS)]
        assert len(types) == 25 and types[-1] == "Warning", types
        # The 25th Event said False; from then on only each return to True was news against it (a flap
        # back to False repeats what was posted), and each was dropped.
        dropped = agent.metrics.registry.get_sample_value("nodefabric_agent_events_dropped_total")
        assert dropped == 8
        await agent.run_pass()
        assert len(k.requests("POST", EVENTS)) == 25, "no token yet: still dropped"
        # Five minutes on, a token: the recovery the budget held back is posted, so the newest Event
        # says what the condition says (not the Warning of a failure that is over).
        now[0] += 300.0
        await agent.run_pass()
        posted = k.requests("POST", EVENTS)
        assert len(posted) == 26 and posted[-1].data["type"] == "Normal", [r.data["reason"] for r in posted]
        now[0] += 300.0
        await agent.run_pass()
        assert len(k.requests("POST", EVENTS)) == 26, "told once"


def stored_events(k):
    """The Events the API server holds (what `kubectl describe` shows), oldest first."""
    return [obj for _, obj in k.api.store.items() if obj.get("kind") == "Event"]


async def test_an_event_that_could_not_be_posted_is_posted_on_a_later_pass(tmp_path):
    """An Event refused by the API (here: its namespace is missing) is not taken as told: the next pass
    posts it, so a failure is not left without its Warning (nor a recovery without its Normal)."""
    two_nic_host(tmp_path)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}}
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path)
        await agent.run_pass()
        k.api.require_namespaces = True
        k.api.remove_object(NAMESPACES, "default")
        break_interface_enumeration(tmp_path)
        await agent.run_pass()
        assert conditions(stored(k))["InterfacesEnumerated"]["status"] == "False"
        assert len(k.requests("POST", EVENTS)) == 1 and stored_events(k) == []
        await agent.run_pass()
        assert len(k.requests("POST", EVENTS)) == 2, "tried again on the next pass"
        k.api.put_object(NAMESPACES, dict(namespace))
        await agent.run_pass()
        assert [e["type"] for e in stored_events(k)] == ["Warning"]
        await agent.run_pass()
        assert len(k.requests("POST", EVENTS)) == 3, "once posted, not again"
        # A recovery whose post fails is tried again as well.
        k.api.remove_object(NAMESPACES, "default")
        restore_interface_enumeration(tmp_path)
        await agent.run_pass()
        assert conditions(stored(k))["InterfacesEnumerated"]["status"] == "True"
        k.api.put_object(NAMESPACES, dict(namespace))
        await agent.run_pass()
        # (The namespace took its Events with it when it went.)
        assert [e["type"] for e in stored_events(k)] == ["Normal"]
        assert len(k.requests("POST", EVENTS)) == 5


async def test_a_link_that_fails_and_recovers_is_one_log_line_and_one_event_each(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    b = two_nic_host(tmp_path)
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path)
        await agent.run_pass()
        assert k.requests("POST", EVENTS) == [], "a healthy first pass is no news"

        set_port(b, "0000:17:00.1", "mlx5_1", Port(state="DOWN", phys_state="Disabled"))
        await agent.run_pass()
        await agent.run_pass()  # still down: not news again
        # A restart reads the failure from the record it published: not news either.
        await make_agent(k, tmp_path).run_pass()
        failed = [r for r in caplog.records if r.getMessage() == "an RDMA link failed"]
        assert len(failed) == 1 and failed[0].levelno == logging.WARNING
        assert failed[0].node == NODE and failed[0].endpoint == "ens1f1" and "DOWN" in failed[0].detail
        [event] = [e.data for e in k.requests("POST", EVENTS)]
        assert (event["type"], event["reason"]) == ("Warning", "LinkFailed")
        assert "ens1f1 (mlx5_1)" in event["message"]

        set_port(b, "0000:17:00.1", "mlx5_1", Port())
        await agent.run_pass()
        await agent.run_pass()
        recovered = [r for r in caplog.records if r.getMessage() == "an RDMA link recovered"]
        assert len(recovered) == 1 and recovered[0].levelno == logging.INFO
        assert recovered[0].node == NODE and recovered[0].endpoint == "ens1f1"
        assert "failed: now ok" in recovered[0].detail
        events = [e.data for e in k.requests("POST", EVENTS)]
        assert [(e["type"], e["reason"]) for e in events] == [
            ("Warning", "LinkFailed"),
            ("Normal", "LinkRecovered"),
        ]
        assert "RDMA link of ens1f1 (mlx5_1) recovered after" in events[1]["message"]
        assert events[1]["involvedObject"]["name"] == NODE
