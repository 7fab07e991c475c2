"""What the DRA driver costs the API server, counted by the embedded API (`RunningAPI.count`): one list and
one watch to start, nothing at all in the steady state, and for someone else's change exactly the writes
that undo it. The driver runs whole (kubelet registration included); no resync comes within a test."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from dra_helpers import (
    DRIVER,
    NODE,
    SLICES,
    Dirs,
    HgxDriver,
    Running,
    client,
    live_slices,
)

from nodefabric_devicemanager.accelerators import Libraries
from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_devicemanager.nodeclient import ApiFailure, Backoff
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder
from nodefabric_deviceplugin.dra.kube import DraApi
from nodefabric_deviceplugin.dra.live import LiveSlices
from nodefabric_deviceplugin.dra.publish import SlicePublisher
from nodefabric_deviceplugin.source import RecordSource
from nodefabric_operator.demo.kubeapi import RunningAPI

NAME = f"{NODE}-{DRIVER}-0"
NODES = "v1/nodes"


async def wait_until(predicate: Any, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)


def budget(k: RunningAPI) -> dict[str, int]:
    """Requests so far, by what they cost the API server."""
    return {
        "list": k.count("GET", SLICES, "list"),
        "watch": k.count("GET", SLICES, "watch"),
        "create": k.count("POST", SLICES),
        "patch": k.count("PATCH", SLICES),
        "delete": k.count("DELETE", SLICES),
        "node": k.count("GET", NODES),
        "all": k.count(),
    }


def spent(k: RunningAPI, before: dict[str, int]) -> dict[str, int]:
    """What was spent since `before`, leaving out what nothing was spent on."""
    return {key: n - before[key] for key, n in budget(k).items() if n != before[key]}


@pytest.fixture
async def settled(api: RunningAPI, hgx_driver: HgxDriver, hgx_spec: DevicesSpec) -> Any:
    """The driver after its first publish, its watch open."""
    async with hgx_driver(hgx_spec, resync=3600) as r:
        await r.kubelet.wait_registered(DRIVER)
        await wait_until(lambda: r.driver.publisher.syncs >= 1 and r.driver.publisher.watch.connects >= 1)
        await wait_until(lambda: api.count("GET", SLICES, "watch") >= 1)
        yield r


async def edit(k: RunningAPI, name: str, patch: dict[str, Any]) -> dict[str, Any]:
    """A hand edit (`kubectl patch --type merge`), through the API."""
    return await asyncio.to_thread(
        client(k).request,
        "PATCH",
        f"/apis/{SLICES}/{name}",
        body=patch,
        content_type="application/merge-patch+json",
    )


async def test_the_first_publish_is_one_list_one_node_read_one_create_and_one_watch(
    settled: Running, api: RunningAPI
) -> None:
    assert spent(api, dict.fromkeys(budget(api), 0)) == {
        "list": 1,
        "node": 1,  # the owner reference, read because there is something to write
        "create": 1,
        "watch": 1,
        "all": 4,
    }
    (obj,) = live_slices(api)
    assert obj["metadata"]["name"] == NAME and obj["spec"]["pool"]["generation"] == 1


async def test_the_steady_state_costs_no_request_and_a_watch_timeout_one_reopen(
    settled: Running, api: RunningAPI, hgx_spec: DevicesSpec
) -> None:
    publisher = settled.driver.publisher
    before, syncs = budget(api), publisher.syncs
    # Every agent pass hands the same record again; kubelet re-registers; the resync comes: ten syncs.
    publisher.resync = 0.02
    for _ in range(5):
        settled.source.update(hgx_spec.model_copy(deep=True))
        publisher.poke()
        await asyncio.sleep(0.01)
    await wait_until(lambda: publisher.syncs >= syncs + 10)
    assert publisher.last_plan is not None and publisher.last_plan.writes == 0
    assert spent(api, before) == {}
    # The API server ends the watch (its timeoutSeconds): it is opened again where it was, nothing listed.
    publisher.resync = 3600
    connects = publisher.watch.connects
    assert api.api.close_watches() == 1
    await wait_until(lambda: publisher.watch.connects > connects and api.count("GET", SLICES, "watch") == 2)
    assert spent(api, before) == {"watch": 1, "all": 1}


async def test_a_slice_kubelet_deleted_comes_back_with_one_write(settled: Running, api: RunningAPI) -> None:
    before = budget(api)
    await asyncio.to_thread(client(api).request, "DELETE", f"/apis/{SLICES}/{NAME}")
    await wait_until(lambda: [o["metadata"]["name"] for o in live_slices(api)] == [NAME])
    await wait_until(lambda: settled.driver.publisher.syncs >= 2)
    # Our DELETE (kubelet's), then the node read for the owner reference and the one create.
    assert spent(api, before) == {"delete": 1, "node": 1, "create": 1, "all": 3}
    await asyncio.sleep(0.5)  # the create's own watch event comes back: old news, no further request
    assert spent(api, before) == {"delete": 1, "node": 1, "create": 1, "all": 3}


async def test_a_hand_edit_is_undone_with_one_write(settled: Running, api: RunningAPI) -> None:
    stored = api.api.stored(SLICES, NAME)
    devices = stored["spec"]["devices"]
    before = budget(api)
    await edit(api, NAME, {"spec": {"devices": devices[:3]}})
    await wait_until(lambda: len(api.api.stored(SLICES, NAME)["spec"]["devices"]) == len(devices))
    restored = api.api.stored(SLICES, NAME)
    assert restored["spec"]["devices"] == devices
    assert restored["spec"]["pool"]["generation"] == 2  # consumers see a new generation, not a flicker
    assert spent(api, before) == {"patch": 2, "node": 1, "all": 3}  # the edit, then our one update
    await asyncio.sleep(0.5)
    assert spent(api, before) == {"patch": 2, "node": 1, "all": 3}


@pytest.mark.parametrize(
    "added",
    [
        {"taints": [{"key": "example.com/maintenance", "value": "x", "effect": "NoSchedule"}]},
        {"capacity": {"example.com/bandwidth": {"value": "400Gi"}}},
        {"allowMultipleAllocations": True},
    ],
    ids=["taints", "capacity", "allowMultipleAllocations"],
)
async def test_a_field_added_by_hand_to_a_published_device_is_undone_with_one_write(
    settled: Running, api: RunningAPI, added: dict[str, Any]
) -> None:
    """Someone edits the published slice, adding a field the driver never writes to one device: the
    slice no longer says what the driver publishes (a hand-added taint would keep the device from being
    allocated), so the driver rewrites it, at the next generation, with one update."""
    devices = api.api.stored(SLICES, NAME)["spec"]["devices"]
    before = budget(api)
    await edit(api, NAME, {"spec": {"devices": [{**devices[0], **added}, *devices[1:]]}})
    await wait_until(lambda: api.api.stored(SLICES, NAME)["spec"]["pool"]["generation"] == 2)
    restored = api.api.stored(SLICES, NAME)
    assert restored["spec"]["devices"] == devices
    assert spent(api, before) == {"patch": 2, "node": 1, "all": 3}  # the edit, then our one update
    await asyncio.sleep(0.5)
    assert spent(api, before) == {"patch": 2, "node": 1, "all": 3}


async def test_an_empty_field_added_to_a_device_is_no_change_and_costs_no_write(
    settled: Running, api: RunningAPI
) -> None:
    """An empty field reads as no field (the API server drops what is empty): the sync the edit's event
    starts writes nothing."""
    publisher = settled.driver.publisher
    devices = api.api.stored(SLICES, NAME)["spec"]["devices"]
    before, syncs = budget(api), publisher.syncs
    await edit(api, NAME, {"spec": {"devices": [{**devices[0], "taints": [], "capacity": {}}, *devices[1:]]}})
    await wait_until(lambda: publisher.syncs > syncs)
    assert publisher.last_plan is not None and publisher.last_plan.writes == 0
    assert api.api.stored(SLICES, NAME)["spec"]["pool"]["generation"] == 1
    assert spent(api, before) == {"patch": 1, "all": 1}  # the edit alone


async def test_a_watch_that_cannot_resume_lists_once_and_writes_nothing(
    settled: Running, api: RunningAPI
) -> None:
    publisher = settled.driver.publisher
    before, connects = budget(api), publisher.watch.connects
    api.api.compact()  # etcd compaction: the watch's resourceVersion leaves the history...
    assert api.api.close_watches(expired=True) == 1  # ...and the server ends it with 410 Expired
    await wait_until(lambda: publisher.watch.connects > connects and api.count("GET", SLICES, "watch") == 2)
    assert spent(api, before) == {"list": 1, "watch": 1, "all": 2}
    await asyncio.sleep(0.5)
    assert spent(api, before) == {"list": 1, "watch": 1, "all": 2}


async def test_a_change_missed_while_the_watch_was_gone_is_repaired_after_the_410(
    settled: Running, api: RunningAPI
) -> None:
    # The API server ends the watch; before the driver can open it again (no await in between: the API
    # runs on this loop), the slice is deleted and the history compacted past it. The resumed watch gets
    # 410 Expired; the list it falls back on shows the slice missing.
    before = budget(api)
    assert api.api.close_watches() == 1
    api.api.remove_object(SLICES, NAME)
    api.api.compact()
    await wait_until(lambda: [o["metadata"]["name"] for o in live_slices(api)] == [NAME])
    await wait_until(lambda: api.count("GET", SLICES, "watch") >= before["watch"] + 2)
    # The refused resume, the list, the node read and the create, the watch from the list.
    assert spent(api, before) == {"watch": 2, "list": 1, "node": 1, "create": 1, "all": 5}


async def test_a_write_refused_with_409_lists_again_and_decides_again(
    api: RunningAPI, dirs: Dirs, hgx_host: tuple[SysfsBuilder, Libraries], hgx_spec: DevicesSpec
) -> None:
    # The publisher alone, no watch: an edit it has not heard of makes its precondition stale.
    config = dirs.config()
    source = RecordSource(hgx_spec)
    publisher = SlicePublisher(DraApi(client(api), config), config, source, hgx_host[0].host)
    await asyncio.to_thread(publisher.sync)
    await edit(api, NAME, {"metadata": {"labels": {"edited": "by-hand"}}})
    fewer = hgx_spec.model_copy(deep=True)
    fewer.interfaces = [i for i in fewer.interfaces if i.rdma_device != "mlx5_0"]
    source.update(fewer)
    before = budget(api)
    decided = await asyncio.to_thread(publisher.sync)
    assert decided is not None and decided.generation == 2
    # The refused PATCH, the list, the PATCH that holds; the owner read before each attempt.
    assert spent(api, before) == {"patch": 2, "list": 1, "node": 2, "all": 5}
    assert len(api.api.stored(SLICES, NAME)["spec"]["devices"]) == 10


def test_which_watch_events_are_news() -> None:
    def obj(name: str, version: str, devices: int = 1) -> dict[str, Any]:
        spec = {
            "pool": {"name": NODE, "generation": 1},
            "devices": [{"name": f"d{i}"} for i in range(devices)],
        }
        return {"metadata": {"name": name, "resourceVersion": version}, "spec": spec}

    live = LiveSlices()
    live.replace([obj("a", "5"), {"metadata": "junk"}, obj("b", "6")])
    assert live.listed and sorted(s.name for s in live.slices()) == ["a", "b"]
    live.wrote(obj("a", "8", devices=2))  # our update's answer...
    assert not live.apply({"type": "MODIFIED", "object": obj("a", "8", devices=2)})  # ...and its echo
    assert not live.apply({"type": "ADDED", "object": obj("b", "6")})  # a replay of what was listed
    assert live.apply({"type": "MODIFIED", "object": obj("a", "9", devices=0)})  # a hand edit
    assert [s.resource_version for s in live.slices() if s.name == "a"] == ["9"]
    live.removed("b")  # our delete...
    assert not live.apply({"type": "DELETED", "object": obj("b", "10")})  # ...and its echo
    assert live.apply({"type": "DELETED", "object": obj("a", "11")})  # kubelet's
    for junk in (
        {"type": "BOOKMARK", "object": obj("c", "12")},
        {"type": "SOMETHING", "object": obj("c", "12")},
        {"type": "ADDED", "object": "not an object"},
        {"type": "ADDED", "object": {"metadata": {}}},
        {"type": "ADDED"},
    ):
        assert not live.apply(junk), junk
    assert live.slices() == []
    live.forget()
    assert not live.listed


async def test_while_the_watch_is_refused_every_sync_lists_as_before(
    dirs: Dirs, hgx_host: tuple[SysfsBuilder, Libraries], hgx_spec: DevicesSpec
) -> None:
    # An API server that refuses the watch (a role without the `watch` verb, from an older chart): nothing
    # would tell the driver of kubelet's deletes, so it falls back to listing on every sync.
    calls: list[str] = []
    stored: dict[str, dict[str, Any]] = {}

    class RefusesWatch:
        def node_owner(self) -> dict[str, Any]:
            return {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "u"}

        def list_slices(self) -> tuple[list[dict[str, Any]], str]:
            calls.append("list")
            return list(stored.values()), "1"

        def watch_slices(self, since: str, cancel: Any = None) -> Iterator[dict[str, Any]]:
            calls.append("watch")
            raise ApiFailure("rejected", "watch resourceslices: HTTP 403 Forbidden", 403)

        def create_slice(self, body: dict[str, Any]) -> dict[str, Any]:
            calls.append("create")
            obj = {**body, "metadata": {**body["metadata"], "resourceVersion": str(len(calls))}}
            stored[obj["metadata"]["name"]] = obj
            return obj

        def update_slice(self, body: dict[str, Any], version: str) -> dict[str, Any]:
            raise AssertionError("nothing to update")

        def delete_slice(self, name: str, version: str) -> None:
            raise AssertionError("nothing to delete")

    source = RecordSource(hgx_spec)
    publisher = SlicePublisher(RefusesWatch(), dirs.config(), source, hgx_host[0].host, resync=0.05)
    publisher.watch.backoff = Backoff(base=0.05, cap=0.1)
    stop = asyncio.Event()
    task = asyncio.create_task(publisher.run(stop))
    try:
        await wait_until(lambda: publisher.watch.failing and calls.count("watch") >= 2)
        stored.clear()  # kubelet deletes the slice: only a list can tell
        await wait_until(lambda: calls.count("create") == 2)
        assert publisher.syncs >= 2
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


class DefaultsADeviceField:
    """The API server setting a device field on every slice written: a later release's default, or a
    mutating admission webhook (a policy adding a taint). What is stored, answered and watched has it."""

    def __init__(self, api: DraApi, field: dict[str, Any]) -> None:
        self.api = api
        self.field = field

    def __getattr__(self, name: str) -> Any:
        return getattr(self.api, name)

    def _defaulted(self, body: dict[str, Any]) -> dict[str, Any]:
        devices = [{**d, **self.field} for d in body["spec"]["devices"]]
        return {**body, "spec": {**body["spec"], "devices": devices}}

    def create_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.api.create_slice(self._defaulted(body))

    def update_slice(self, body: dict[str, Any], version: str) -> dict[str, Any]:
        return self.api.update_slice(self._defaulted(body), version)


async def test_a_device_field_the_api_server_sets_on_every_write_is_not_rewritten_at_every_sync(
    api: RunningAPI, dirs: Dirs, hgx_host: tuple[SysfsBuilder, Libraries], hgx_spec: DevicesSpec
) -> None:
    """Every device field counts in the comparison (a hand-added one is drift). One the API server sets
    itself on every write of ours (its default, a webhook's) read as drift too: each sync (each record
    change, each resync, each kubelet registration) rewrote the slice at a new pool generation, for
    ever. The API server's answer to our own write is what we wrote, in its form; a hand edit of the
    slice after it is still drift."""
    config = dirs.config()
    defaulting = DefaultsADeviceField(DraApi(client(api), config), {"bindsToNode": True})
    publisher = SlicePublisher(defaulting, config, RecordSource(hgx_spec), hgx_host[0].host, resync=3600)
    stop = asyncio.Event()
    task = asyncio.create_task(publisher.run(stop))
    try:
        await wait_until(lambda: publisher.syncs >= 1 and publisher.watch.connects >= 1)
        before = budget(api)
        for again in range(3):
            syncs = publisher.syncs
            if again == 2:
                publisher.live.forget()  # the copy doubtful (a 409): this sync lists first
            publisher.poke()  # kubelet registered the driver again
            await wait_until(lambda: publisher.syncs > syncs)  # noqa: B023
            assert publisher.last_plan is not None and publisher.last_plan.writes == 0
        assert api.api.stored(SLICES, NAME)["spec"]["pool"]["generation"] == 1
        assert {k: n for k, n in spent(api, before).items() if k in ("create", "patch", "delete")} == {}
        devices = api.api.stored(SLICES, NAME)["spec"]["devices"]
        await edit(api, NAME, {"spec": {"devices": [{**devices[0], "nodeName": "elsewhere"}, *devices[1:]]}})
        await wait_until(lambda: api.api.stored(SLICES, NAME)["spec"]["pool"]["generation"] == 2)
        assert api.api.stored(SLICES, NAME)["spec"]["devices"] == devices
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
