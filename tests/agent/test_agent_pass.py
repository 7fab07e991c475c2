"""The real agent pass against the API emulator over HTTP, reading fixture host trees."""

from __future__ import annotations

import asyncio

from agent_fixtures import (
    DEVICES,
    NODE,
    api_with_node,
    break_interface_enumeration,
    conditions,
    delete_node,
    interface,
    make_agent,
    operator_writes_status,
    restore_interface_enumeration,
    set_port,
    stored,
    two_nic_host,
    until,
    writes,
)

from nodefabric_devicemanager.agent.core import Result
from nodefabric_devicemanager.testing.sysfs import Port


async def test_first_pass_creates_the_record_owned_by_its_node(tmp_path):
    two_nic_host(tmp_path)
    async with api_with_node() as k:
        node_uid = k.api.stored("v1/nodes", NODE)["metadata"]["uid"]
        outcome = await make_agent(k, tmp_path).run_pass()

        assert outcome.result is Result.CREATED and outcome.wrote == ("create", "status")
        obj = stored(k)
        assert obj["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid}
        ]
        assert [i["name"] for i in obj["spec"]["interfaces"]] == ["ens1f0", "ens1f1"]
        assert interface(obj, "ens1f1")["rdmaDevice"] == "mlx5_1"
        assert interface(obj, "ens1f1")["link"]["state"] == "ok"
        conds = conditions(obj)
        assert conds["InterfacesEnumerated"]["status"] == "True"
        assert conds["AcceleratorsEnumerated"]["status"] == "True"
        assert conds["InterfacesEnumerated"]["lastTransitionTime"]


async def test_a_pass_with_nothing_changed_writes_nothing(tmp_path):
    two_nic_host(tmp_path)
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path)
        await agent.run_pass()
        before = len(writes(k))

        for _ in range(3):
            outcome = await agent.run_pass()
            assert outcome.result is Result.UNCHANGED and outcome.wrote == ()

        assert len(writes(k)) == before
        # A fresh agent process (restart) reading the same host agrees with what is stored.
        assert (await make_agent(k, tmp_path).run_pass()).wrote == ()
        assert len(writes(k)) == before


async def test_a_link_going_down_is_written_once_and_its_first_seen_time_holds(tmp_path):
    b = two_nic_host(tmp_path)
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path)
        await agent.run_pass()
        before = len(writes(k))

        set_port(b, "0000:17:00.1", "mlx5_1", Port(state="DOWN", phys_state="Disabled"))
        outcome = await agent.run_pass()
        assert outcome.wrote == ("spec", "status")  # the verdict, then the failedLinks count beside it
        assert stored(k)["status"]["failedLinks"] == 1
        link = interface(stored(k), "ens1f1")["link"]
        assert link["state"] == "failed"
        assert "DOWN" in link["reason"] and "Disabled" in link["reason"]
        first_seen = link["firstSeenTime"]
        assert first_seen
        assert interface(stored(k), "ens1f0")["link"]["state"] == "ok"
        assert len(writes(k)) == before + 2

        # The failure persists across passes and across an agent restart: no write, same time.
        for a in (agent, make_agent(k, tmp_path)):
            assert (await a.run_pass()).wrote == ()
        assert interface(stored(k), "ens1f1")["link"]["firstSeenTime"] == first_seen
        assert len(writes(k)) == before + 2

        # Recovery clears the time; a later failure starts a new one.
        set_port(b, "0000:17:00.1", "mlx5_1", Port())
        assert (await agent.run_pass()).wrote == ("spec", "status")
        assert stored(k)["status"]["failedLinks"] == 0
        assert "firstSeenTime" not in interface(stored(k), "ens1f1")["link"]
        assert interface(stored(k), "ens1f1")["link"]["state"] == "ok"


async def test_a_failed_enumeration_keeps_the_record_and_clears_on_recovery(tmp_path, caplog):
    two_nic_host(tmp_path)
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path)
        await agent.run_pass()
        recorded = stored(k)["spec"]["interfaces"]

        break_interface_enumeration(tmp_path)
        outcome = await agent.run_pass()
        assert outcome.ok and outcome.degraded == ("InterfacesEnumerated",)
        assert outcome.wrote == ("status",), "the spec is kept, only the condition changes"
        obj = stored(k)
        assert obj["spec"]["interfaces"] == recorded
        cond = conditions(obj)["InterfacesEnumerated"]
        assert cond["status"] == "False" and cond["reason"] and "/sys/class/net" in cond["message"]
        errors = [r for r in caplog.records if r.levelname == "ERROR" and r.name.startswith("nodefabric")]
        assert any(getattr(r, "condition", "") == "InterfacesEnumerated" for r in errors)

        # No flapping: the failure persisting costs no write and keeps its transition time.
        assert (await agent.run_pass()).wrote == ()
        assert conditions(stored(k))["InterfacesEnumerated"] == cond

        restore_interface_enumeration(tmp_path)
        assert (await agent.run_pass()).wrote == ("status",)
        healed = conditions(stored(k))["InterfacesEnumerated"]
        assert healed["status"] == "True"
        assert stored(k)["spec"]["interfaces"] == recorded
        assert (await agent.run_pass()).wrote == ()


async def test_an_enumeration_that_finds_nothing_writes_the_empty_list(tmp_path):
    b = two_nic_host(tmp_path)
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path)
        await agent.run_pass()
        for name in ("ens1f0", "ens1f1"):
            (b.root / "sys/class/net" / name).unlink()
        assert (await agent.run_pass()).wrote == ("spec", "status")
        assert stored(k)["spec"]["interfaces"] == []
        assert conditions(stored(k))["InterfacesEnumerated"]["status"] == "True"


async def test_a_first_pass_that_cannot_enumerate_still_publishes_the_failure(tmp_path):
    two_nic_host(tmp_path)
    break_interface_enumeration(tmp_path)
    async with api_with_node() as k:
        outcome = await make_agent(k, tmp_path).run_pass()
        assert outcome.result is Result.CREATED
        assert conditions(stored(k))["InterfacesEnumerated"]["status"] == "False"


async def test_deleting_the_node_removes_the_record_and_the_agent_does_not_recreate_it(tmp_path):
    two_nic_host(tmp_path)
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path, interval=3600)
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        await until(
            lambda: agent.watch.connects >= 1 and stored(k) is not None, what="the record and its watch"
        )

        await delete_node(k)
        assert stored(k) is None, "garbage-collected through the owner reference"
        # The watch reports the deletion; the pass it brings finds no Node to own a new record.
        await until(
            lambda: agent.last_outcome is not None and "does not exist" in agent.last_outcome.error,
            what="the pass after the deletion",
        )
        assert agent.last_outcome.result is Result.FAILED
        assert stored(k) is None, "an orphan would outlive every later node of that name"
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_conflicts_and_outages_are_retried_within_the_pass(tmp_path):
    b = two_nic_host(tmp_path)
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path)
        k.api.fail_next(1, 409)
        k.api.fail_next(2, 503)
        outcome = await agent.run_pass()
        assert outcome.result is Result.CREATED
        assert stored(k) is not None and conditions(stored(k))["InterfacesEnumerated"]["status"] == "True"
        assert len(k.requests("POST", DEVICES)) == 4  # 409, 503, 503, then created

        set_port(b, "0000:17:00.0", "mlx5_0", Port(state="ACTIVE_DEFER", phys_state="LinkUp"))
        k.api.fail_next(1, 500)
        assert (await agent.run_pass()).wrote == ("spec", "status")
        assert interface(stored(k), "ens1f0")["link"]["state"] == "failed"

        errors = agent.metrics.registry.get_sample_value
        assert errors("nodefabric_agent_errors_total", {"kind": "conflict"}) == 1
        assert errors("nodefabric_agent_errors_total", {"kind": "unavailable"}) == 3


async def test_a_long_outage_fails_the_pass_without_raising(tmp_path):
    two_nic_host(tmp_path)
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path, attempts=3)
        k.api.fail_next(3, 503)
        outcome = await agent.run_pass()
        assert outcome.result is Result.FAILED and "503" in outcome.error
        assert stored(k) is None
        assert not agent.readiness().ok
        assert (await agent.run_pass()).result is Result.CREATED
        assert agent.readiness().ok


async def test_another_writers_conditions_and_status_survive(tmp_path):
    two_nic_host(tmp_path)
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path)
        await agent.run_pass()
        # The operator writes its own condition (with a field our model does not know) and labels.
        theirs = {
            "type": "LabelsPublished",
            "status": "True",
            "reason": "Published",
            "observedGeneration": 1,
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
        labels = {"feature.gpustack.ai/rdma.capable": "true"}
        await operator_writes_status(k, [*stored(k)["status"]["conditions"], theirs], labels)
        # The API server prunes what the CRD does not declare (observedGeneration); the rest is theirs.
        theirs = conditions(stored(k))["LabelsPublished"]

        break_interface_enumeration(tmp_path)
        assert (await agent.run_pass()).wrote == ("status",)
        after = stored(k)
        assert conditions(after)["LabelsPublished"] == theirs
        assert after["status"]["labels"] == labels
        assert conditions(after)["InterfacesEnumerated"]["status"] == "False"


async def test_a_record_without_an_owner_gets_one(tmp_path):
    two_nic_host(tmp_path)
    async with api_with_node() as k:
        k.api.put_object(
            DEVICES,
            {
                "apiVersion": "worker.gpustack.ai/v1alpha1",
                "kind": "Devices",
                "metadata": {"name": NODE},
                "spec": {},
            },
        )
        outcome = await make_agent(k, tmp_path).run_pass()
        assert outcome.wrote == ("spec", "status")
        owners = stored(k)["metadata"]["ownerReferences"]
        assert [o["kind"] for o in owners] == ["Node"]


async def test_a_record_owned_by_another_node_is_made_this_nodes_own(tmp_path):
    """A record of this node's name owned by another Node (copied from that node's record, or created by
    a tool that named the wrong owner) was left so: any Node owner passed. Deleting this Node then left
    the record (the other Node still owned it) for the next node of the name to inherit, and deleting the
    other Node deleted it. The other Node's reference is replaced by this one's; other owners stay."""
    two_nic_host(tmp_path)
    async with api_with_node() as k:
        other = k.api.put_object("v1/nodes", {"metadata": {"name": "gpu-node-2"}})
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "name": "inventory", "uid": "cm-1"}
        k.api.put_object(
            DEVICES,
            {
                "apiVersion": "worker.gpustack.ai/v1alpha1",
                "kind": "Devices",
                "metadata": {
                    "name": NODE,
                    "ownerReferences": [
                        cm,
                        {
                            "apiVersion": "v1",
                            "kind": "Node",
                            "name": "gpu-node-2",
                            "uid": other["metadata"]["uid"],
                        },
                    ],
                },
                "spec": {},
            },
        )
        node_uid = k.api.stored("v1/nodes", NODE)["metadata"]["uid"]
        assert (await make_agent(k, tmp_path).run_pass()).wrote == ("spec", "status")
        owners = stored(k)["metadata"]["ownerReferences"]
        assert owners == [cm, {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid}]


async def test_pass_metrics_describe_the_record(tmp_path):
    b = two_nic_host(tmp_path)
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path)
        set_port(b, "0000:17:00.1", "mlx5_1", Port(state="DOWN", phys_state="Disabled"))
        await agent.run_pass()
        await agent.run_pass()
        value = agent.metrics.registry.get_sample_value
        assert value("nodefabric_agent_passes_total", {"kind": "walk", "result": "ok"}) == 2
        assert value("nodefabric_agent_pass_duration_seconds_count", {"kind": "walk"}) == 2
        assert value("nodefabric_agent_api_writes_total", {"kind": "create"}) == 1
        assert value("nodefabric_agent_api_writes_total", {"kind": "status"}) == 1
        assert value("nodefabric_agent_api_writes_total", {"kind": "spec"}) is None
        assert value("nodefabric_agent_endpoints", {"verdict": "ok"}) == 1
        assert value("nodefabric_agent_endpoints", {"verdict": "failed"}) == 1
        assert value("nodefabric_agent_endpoints", {"verdict": "unverified"}) == 0

        break_interface_enumeration(tmp_path)
        await agent.run_pass()
        assert value("nodefabric_agent_errors_total", {"kind": "interfaces"}) == 1


async def test_an_inventory_that_raises_keeps_everything_and_says_so(tmp_path):
    two_nic_host(tmp_path)
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path)
        await agent.run_pass()
        recorded = stored(k)["spec"]

        def broken_reader(host):
            raise RuntimeError("vendor library crashed")

        agent.reader = broken_reader
        outcome = await agent.run_pass()
        assert not outcome.ok and outcome.wrote == ("status",), "failed (not ready), and said in the record"
        assert "vendor library crashed" in outcome.error
        assert set(outcome.degraded) == {"InterfacesEnumerated", "AcceleratorsEnumerated"}
        assert stored(k)["spec"] == recorded
        cond = conditions(stored(k))["InterfacesEnumerated"]
        assert cond["reason"] == "InventoryError" and "vendor library crashed" in cond["message"]


async def test_a_rejected_write_fails_the_pass_and_the_next_pass_tries_again(tmp_path):
    two_nic_host(tmp_path)
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path)
        k.api.fail_next(1, 422)
        outcome = await agent.run_pass()
        assert outcome.result is Result.FAILED and "422" in outcome.error
        assert len(k.requests("POST", DEVICES)) == 1, "retrying a refused request cannot help"
        assert (await agent.run_pass()).result is Result.CREATED


async def test_record_consumers_get_the_host_reading_even_when_the_api_refuses(tmp_path):
    b = two_nic_host(tmp_path)
    async with api_with_node() as k:
        agent = make_agent(k, tmp_path, attempts=1)
        seen = []
        agent.subscribe(seen.append)
        k.api.fail_next(1, 503)
        assert (await agent.run_pass()).result is Result.FAILED
        assert [i.name for i in seen[-1].interfaces] == ["ens1f0", "ens1f1"]

        assert (await agent.run_pass()).result is Result.CREATED
        set_port(b, "0000:17:00.1", "mlx5_1", Port(state="DOWN", phys_state="Disabled"))
        k.api.fail_next(1, 503)
        assert (await agent.run_pass()).result is Result.FAILED
        assert seen[-1].interfaces[1].link.state == "failed", "the plugin marks it Unhealthy without the API"
        assert len(seen) == 2, "the created record equals the one handed on during the outage: not again"
