"""What a running agent costs the API server and the host, pinned with request counts at the embedded API:
no GET of its own object per pass, zero writes in the steady state, link state refreshed between walks
without a walk, someone else's write seen on the watch (and undone when it touched our part)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator

from agent_fixtures import (
    DEVICES,
    api_with_node,
    delete_devices,
    hand_edits_spec,
    interface,
    make_agent,
    operator_writes_status,
    set_port,
    stored,
    two_nic_host,
    until,
    watched,
    writes,
)

from nodefabric_devicemanager.testing.sysfs import Port


@contextlib.asynccontextmanager
async def running(agent) -> AsyncIterator[asyncio.Event]:
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        yield stop
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


def passes(agent, kind: str) -> float:
    return (
        agent.metrics.registry.get_sample_value(
            "nodefabric_agent_passes_total", {"kind": kind, "result": "ok"}
        )
        or 0.0
    )


async def test_the_steady_state_costs_no_request_per_pass(tmp_path):
    two_nic_host(tmp_path)
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path, interval=0.05, walk_interval=3600)
        async with running(agent):
            await until(lambda: watched(k) and passes(agent, "refresh") >= 2, what="a running agent")
            gets, written = k.count("GET", DEVICES), len(writes(k))
            start = passes(agent, "refresh")
            await until(lambda: passes(agent, "refresh") >= start + 20, what="20 more passes")
            assert k.count("GET", DEVICES) == gets, "no GET (and no new watch) per pass"
            assert len(writes(k)) == written == 2, "create and status once, then nothing"
            assert passes(agent, "walk") == 1, "link refreshes between walks, no walk"
        # One list (the first pass) and one watch: everything a running agent asked for.
        assert k.count("GET", DEVICES) == 2


async def test_a_link_change_is_found_by_the_refresh_without_a_walk(tmp_path):
    b = two_nic_host(tmp_path)
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path, interval=0.05, walk_interval=3600)
        async with running(agent):
            await until(lambda: watched(k) and passes(agent, "refresh") >= 1, what="the first refresh")
            gets = k.count("GET", DEVICES)
            set_port(b, "0000:17:00.1", "mlx5_1", Port(state="DOWN", phys_state="Disabled"))
            await until(
                lambda: interface(stored(k), "ens1f1")["link"]["state"] == "failed", what="the refresh"
            )
            link = interface(stored(k), "ens1f1")["link"]
            assert "DOWN" in link["reason"] and link["firstSeenTime"]
            (b.root / "sys/class/net/ens1f0/operstate").write_text("down\n")
            await until(lambda: interface(stored(k), "ens1f0")["up"] is False, what="operstate refreshed")
            assert passes(agent, "walk") == 1
            assert k.count("GET", DEVICES) == gets, "the write used the resourceVersion it kept"


async def test_a_vanished_interface_brings_a_walk(tmp_path):
    b = two_nic_host(tmp_path)
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path, interval=0.05, walk_interval=3600)
        async with running(agent):
            await until(lambda: passes(agent, "refresh") >= 1, what="the first refresh")
            # Unplugged, and its uevent missed: the netdev's directory goes, and its class link.
            link = b.root / "sys/class/net/ens1f1"
            shutil.rmtree(link.resolve())
            link.unlink()
            await until(lambda: passes(agent, "walk") == 2, what="the walk the refresh asked for")
            assert [i["name"] for i in stored(k)["spec"]["interfaces"]] == ["ens1f0"]


async def test_another_writers_status_costs_no_write_and_a_hand_edit_of_the_spec_is_undone(tmp_path):
    two_nic_host(tmp_path)
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path, interval=3600, walk_interval=3600)
        async with running(agent):
            await until(lambda: watched(k) and stored(k) is not None, what="a running agent")
            written, gets = len(writes(k)), k.count("GET", DEVICES)
            seen = agent.metrics.watch_events._value.get

            labels = {"feature.gpustack.ai/rdma.capable": "true"}
            await operator_writes_status(k, stored(k)["status"]["conditions"], labels)
            await until(lambda: seen() >= 1, what="the watch event for the operator's write")
            await until(lambda: passes(agent, "sync") >= 1, what="the sync pass")
            assert len(writes(k)) == written + 1, "only the operator's own write"

            edited = stored(k)
            recorded = edited["spec"]["interfaces"]
            await hand_edits_spec(k, {"interfaces": recorded[:1]})
            await until(lambda: stored(k)["spec"]["interfaces"] == recorded, what="the spec restored")
            assert len(writes(k)) == written + 3, "the operator's status, the hand edit, one restoring patch"
            assert k.count("GET", DEVICES) == gets, "the watch told the agent; it did not ask"


async def test_a_deleted_record_is_recreated_while_its_node_exists(tmp_path):
    two_nic_host(tmp_path)
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path, interval=3600, walk_interval=3600)
        async with running(agent):
            await until(lambda: watched(k) and stored(k) is not None, what="a running agent")
            recorded = stored(k)["spec"]
            await delete_devices(k)
            await until(lambda: stored(k) is not None, what="the record recreated")
            assert stored(k)["spec"] == recorded
            assert [o["kind"] for o in stored(k)["metadata"]["ownerReferences"]] == ["Node"]


async def test_a_record_right_in_all_but_its_owner_gets_the_owner_only(tmp_path):
    two_nic_host(tmp_path)
    async with api_with_node() as k:
        await make_agent(k, tmp_path).run_pass()
        obj = stored(k)
        obj["metadata"].pop("ownerReferences")
        k.api.put_object(DEVICES, obj)
        fresh = make_agent(k, tmp_path)
        assert (await fresh.run_pass()).wrote == ("spec",), "a metadata patch, the spec itself unchanged"
        assert [o["kind"] for o in stored(k)["metadata"]["ownerReferences"]] == ["Node"]
        assert (await fresh.run_pass()).wrote == ()


async def test_a_fifo_where_a_port_state_belongs_is_refused_between_walks_without_blocking(tmp_path):
    b = two_nic_host(tmp_path)
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path, interval=0.05, walk_interval=3600, read_timeout=30)
        async with running(agent):
            await until(lambda: passes(agent, "refresh") >= 1, what="the first refresh")
            state = b.functions["0000:17:00.1"] / "infiniband" / "mlx5_1" / "ports" / "1" / "state"
            state.unlink()
            os.mkfifo(state)
            await until(
                lambda: interface(stored(k), "ens1f1")["link"]["state"] == "unverified", what="refused"
            )
            assert "FIFO" in interface(stored(k), "ens1f1")["link"]["reason"]
            assert interface(stored(k), "ens1f0")["link"]["state"] == "ok"
            assert agent.last_outcome is not None and agent.last_outcome.ok, "refused, not stuck"
            assert passes(agent, "walk") == 1


async def test_the_heap_is_given_back_after_a_walk_or_a_write_not_a_quiet_refresh(tmp_path, monkeypatch):
    """glibc keeps freed memory in the process unless asked; the agent asks after a pass that allocated
    a record's worth (a walk, a write). The C library's call is the edge faked here, counted."""
    from nodefabric_devicemanager.agent import heap

    trims: list[int] = []
    monkeypatch.setattr(heap, "_trim", lambda: lambda pad: trims.append(pad) or 1)
    b = two_nic_host(tmp_path)
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path, interval=0.05, walk_interval=3600)
        async with running(agent):
            await until(lambda: watched(k) and passes(agent, "refresh") >= 3, what="quiet refreshes")
            assert trims == [0], "once, after the first walk and its writes; not after quiet refreshes"
            set_port(b, "0000:17:00.1", "mlx5_1", Port(state="DOWN", phys_state="Disabled"))
            await until(lambda: len(trims) == 2, what="the refresh that wrote")
            assert passes(agent, "walk") == 1


def test_release_asks_the_c_library_where_it_can():
    """On glibc (this suite's Linux) the call exists and is made; the answer is a bool either way."""
    import platform

    from nodefabric_devicemanager.agent import heap

    assert isinstance(heap.release(), bool)
    assert isinstance(heap.one_arena(), bool)
    if platform.libc_ver()[0] == "glibc":
        assert heap._trim() is not None
        assert heap.one_arena(), "glibc accepts M_ARENA_MAX"
