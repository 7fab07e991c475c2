"""The plugin against the test kubelet over real unix sockets: registration, lists, Allocate, restarts."""

from __future__ import annotations

import asyncio
import logging
import os

import grpc
import pytest
from dp_helpers import (
    FixtureHost,
    Running,
    by_id,
    hint,
    nic,
    shutdown,
    start_plugin,
    two_nics_and_vfs,
    vf,
)

from nodefabric_devicemanager.models import DevicesSpec, LinkState, LinkVerdict
from nodefabric_deviceplugin import metrics
from nodefabric_deviceplugin.api import deviceplugin_pb2 as pb
from nodefabric_deviceplugin.resources import PluginConfig
from nodefabric_deviceplugin.testing.kubelet import KubeletEmulator

EXCLUSIVE = "device.gpustack.ai/rdma"
SHARED = "device.gpustack.ai/rdma.shared"
PARTITIONED = "device.gpustack.ai/rdma.partitioned"


async def test_registers_the_three_keys_after_serving(running: Running) -> None:
    for resource, socket in (
        (EXCLUSIVE, "nodefabric-rdma.sock"),
        (SHARED, "nodefabric-rdma.shared.sock"),
        (PARTITIONED, "nodefabric-rdma.partitioned.sock"),
    ):
        reg = await running.kubelet.wait_registered(resource)
        assert reg.version == "v1beta1"
        assert reg.endpoint == socket
        assert reg.options.get_preferred_allocation_available
        assert not reg.options.pre_start_required
        options = await running.kubelet.plugin(resource).options()
        assert options.get_preferred_allocation_available


async def test_device_lists_carry_health_and_topology(running: Running) -> None:
    exclusive = by_id(await running.kubelet.wait_devices(EXCLUSIVE))
    # eth0 has no RDMA device and the partitioned PF is served only as VFs.
    assert sorted(exclusive) == ["0000:19:00.0", "0000:5e:00.0"]
    assert hint(exclusive["0000:19:00.0"]) == [0]
    assert hint(exclusive["0000:5e:00.0"]) == [1]
    assert {d.health for d in exclusive.values()} == {"Healthy"}

    shared = await running.kubelet.wait_devices(SHARED)
    assert len(shared) == 2 * 4  # shared_count=4 in these tests
    assert len({d.ID for d in shared}) == 8

    partitioned = by_id(await running.kubelet.wait_devices(PARTITIONED))
    assert sorted(partitioned) == ["0000:86:00.1", "0000:86:00.2"]
    assert hint(partitioned["0000:86:00.1"]) == [1]
    # The VF without NUMA of its own falls back to its parent's.
    assert hint(partitioned["0000:86:00.2"]) == [1]
    assert running.kubelet.resources[PARTITIONED].allocatable == 2


async def test_a_link_going_down_is_pushed_as_unhealthy_on_the_open_stream(running: Running) -> None:
    await running.kubelet.wait_devices(EXCLUSIVE, lambda ds: len(ds) == 2)
    spec = two_nics_and_vfs()
    spec.interfaces[1].link.state = LinkState.FAILED  # type: ignore[union-attr]
    assert running.source.update(spec)

    def down(devices: list[pb.Device]) -> bool:
        return by_id(devices).get("0000:19:00.0", pb.Device()).health == "Unhealthy"

    devices = by_id(await running.kubelet.wait_devices(EXCLUSIVE, down))
    assert devices["0000:5e:00.0"].health == "Healthy"
    # The failed endpoint keeps its tokens: capacity stays, allocatable drops.
    state = running.kubelet.resources[EXCLUSIVE]
    assert (state.capacity, state.allocatable) == (2, 1)
    shared = await running.kubelet.wait_devices(
        SHARED, lambda ds: sum(d.health == "Unhealthy" for d in ds) == 4
    )
    assert len(shared) == 8
    assert not state.stream_ended


async def test_a_vf_appearing_is_pushed(running: Running) -> None:
    await running.kubelet.wait_devices(PARTITIONED, lambda ds: len(ds) == 2)
    spec = two_nics_and_vfs()
    spec.interfaces[3].virtual_functions.append(vf("0000:86:00.3", "mlx5_9", numa="1"))
    spec.interfaces[3].sriov_num_vfs = 3
    running.source.update(spec)
    devices = await running.kubelet.wait_devices(PARTITIONED, lambda ds: len(ds) == 3)
    assert "0000:86:00.3" in by_id(devices)


async def test_an_unchanged_record_sends_nothing(running: Running) -> None:
    await running.kubelet.wait_devices(EXCLUSIVE, lambda ds: len(ds) == 2)
    before = running.kubelet.resources[EXCLUSIVE].lists_received
    assert not running.source.update(two_nics_and_vfs())
    # A change elsewhere (a VF appears) wakes every stream, but only the partitioned list differs.
    spec = two_nics_and_vfs()
    spec.interfaces[3].virtual_functions.append(vf("0000:86:00.3", "mlx5_9"))
    running.source.update(spec)
    await running.kubelet.wait_devices(PARTITIONED, lambda ds: len(ds) == 3)
    await asyncio.sleep(0.05)
    assert running.kubelet.resources[EXCLUSIVE].lists_received == before


async def test_allocate_exclusive_hands_over_own_verbs_device_rdma_cm_and_nccl(running: Running) -> None:
    plugin = running.kubelet.plugin(EXCLUSIVE)
    before = metrics.ALLOCATIONS.labels("rdma", "granted")._value.get()
    response = await plugin.allocate(["0000:5e:00.0", "0000:19:00.0"])
    (container,) = response.container_responses
    paths = [d.host_path for d in container.devices]
    # mlx5_0 is uverbs7 and mlx5_1 is uverbs2: looked up, never derived from the name.
    assert paths == ["/dev/infiniband/uverbs7", "/dev/infiniband/uverbs2", "/dev/infiniband/rdma_cm"]
    assert all(d.container_path == d.host_path and d.permissions == "rw" for d in container.devices)
    assert dict(container.envs) == {"NCCL_IB_HCA": "=mlx5_0,mlx5_1"}
    assert not container.mounts
    assert metrics.ALLOCATIONS.labels("rdma", "granted")._value.get() == before + 1


async def test_allocate_shared_two_tokens_of_one_endpoint_give_one_device(running: Running) -> None:
    shared = await running.kubelet.wait_devices(SHARED)
    ids = [d.ID for d in shared if d.ID.startswith("0000:19:00.0-")][:2]
    response = await running.kubelet.plugin(SHARED).allocate(ids)
    (container,) = response.container_responses
    assert [d.host_path for d in container.devices] == ["/dev/infiniband/uverbs7", "/dev/infiniband/rdma_cm"]
    assert container.envs["NCCL_IB_HCA"] == "=mlx5_0"


async def test_allocate_partitioned_vf_without_netdev(running: Running) -> None:
    response = await running.kubelet.plugin(PARTITIONED).allocate(["0000:86:00.2"], ["0000:86:00.1"])
    first, second = response.container_responses
    assert [d.host_path for d in first.devices] == ["/dev/infiniband/uverbs5", "/dev/infiniband/rdma_cm"]
    assert first.envs["NCCL_IB_HCA"] == "=mlx5_4"
    assert [d.host_path for d in second.devices] == ["/dev/infiniband/uverbs4", "/dev/infiniband/rdma_cm"]


async def test_allocate_without_rdma_cm_on_the_host(running: Running, fixture_host: FixtureHost) -> None:
    os.unlink(fixture_host.builder.path("/dev/infiniband/rdma_cm"))
    response = await running.kubelet.plugin(EXCLUSIVE).allocate(["0000:19:00.0"])
    assert [d.host_path for d in response.container_responses[0].devices] == ["/dev/infiniband/uverbs7"]


async def test_unknown_token_is_refused_not_dropped(running: Running) -> None:
    plugin = running.kubelet.plugin(EXCLUSIVE)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        # A partitioned token is no endpoint of the exclusive family.
        await plugin.allocate(["0000:19:00.0", "0000:86:00.1"])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "0000:86:00.1" in (err.value.details() or "")


async def test_unresolvable_verbs_device_fails_naming_the_locations(
    running: Running, fixture_host: FixtureHost
) -> None:
    b = fixture_host.builder
    os.unlink(b.path("/sys/class/infiniband_verbs/uverbs2"))
    for name in ("ibdev", "abi_version", "dev"):
        os.unlink(b.functions["0000:5e:00.0"] / "infiniband_verbs" / "uverbs2" / name)
    (b.functions["0000:5e:00.0"] / "infiniband_verbs" / "uverbs2" / "device").unlink()
    (b.functions["0000:5e:00.0"] / "infiniband_verbs" / "uverbs2").rmdir()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await running.kubelet.plugin(EXCLUSIVE).allocate(["0000:5e:00.0"])
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = err.value.details() or ""
    assert "mlx5_1" in details
    assert "/sys/class/infiniband_verbs/uverbs*/ibdev" in details
    assert "/sys/class/infiniband/mlx5_1/device/infiniband_verbs" in details


async def test_preferred_allocation_over_grpc(running: Running) -> None:
    shared = [d.ID for d in await running.kubelet.wait_devices(SHARED)]
    chosen = await running.kubelet.plugin(SHARED).preferred(shared, [], 2)
    # Distinct endpoints before a second token of one endpoint.
    assert chosen == ["0000:19:00.0-0", "0000:5e:00.0-0"]


async def test_kubelet_restart_reregisters(running: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    await running.kubelet.wait_registered(EXCLUSIVE)
    before = metrics.REGISTRATIONS.labels("rdma", "ok")._value.get()
    # The plugin serves a deleted socket again within one poll, possibly before restart() returns: record
    # what the restart removed rather than looking for the (transient) absence afterwards.
    removed: list[str] = []
    unlink = os.unlink

    def recording_unlink(path: str, *args: object, **kwargs: object) -> None:
        unlink(path, *args, **kwargs)  # type: ignore[arg-type]
        removed.append(os.fspath(path))

    with monkeypatch.context() as patched:
        patched.setattr(os, "unlink", recording_unlink)
        await running.kubelet.restart()
    assert os.path.join(running.manager.plugin_dir, "nodefabric-rdma.sock") in removed
    for resource in (EXCLUSIVE, SHARED, PARTITIONED):
        await running.kubelet.wait_registered(resource, count=2)
    devices = await running.kubelet.wait_devices(EXCLUSIVE, lambda ds: len(ds) == 2)
    assert len(devices) == 2
    response = await running.kubelet.plugin(EXCLUSIVE).allocate(["0000:19:00.0"])
    assert response.container_responses[0].envs["NCCL_IB_HCA"] == "=mlx5_0"
    assert metrics.REGISTRATIONS.labels("rdma", "ok")._value.get() == before + 1
    # The DEPRECATION file kubelet writes is not a reason to register again.
    await asyncio.sleep(0.1)
    assert running.kubelet.registrations(EXCLUSIVE) == 2


async def test_our_socket_deleted_is_served_again(running: Running) -> None:
    await running.kubelet.wait_registered(SHARED)
    os.unlink(os.path.join(running.manager.plugin_dir, "nodefabric-rdma.shared.sock"))
    await running.kubelet.wait_registered(SHARED, count=2)
    assert os.path.exists(os.path.join(running.manager.plugin_dir, "nodefabric-rdma.shared.sock"))
    assert running.kubelet.registrations(EXCLUSIVE) == 1


async def test_many_concurrent_list_and_watch_streams(running: Running) -> None:
    plugin = running.kubelet.plugin(EXCLUSIVE)
    calls = [plugin.list_and_watch() for _ in range(64)]
    try:
        firsts = await asyncio.gather(*(c.read() for c in calls))
        assert all(len(m.devices) == 2 for m in firsts)  # type: ignore[union-attr]
        spec = two_nics_and_vfs()
        spec.interfaces[2].link.state = LinkState.FAILED  # type: ignore[union-attr]
        running.source.update(spec)
        seconds = await asyncio.wait_for(asyncio.gather(*(c.read() for c in calls)), timeout=30)
        for message in seconds:
            assert by_id(list(message.devices))["0000:5e:00.0"].health == "Unhealthy"  # type: ignore[union-attr]
    finally:
        for c in calls:
            c.cancel()


async def test_no_rdma_node_registers_every_key_with_zero_devices(
    plugin_dir: str, fixture_host: FixtureHost
) -> None:
    r = await start_plugin(
        plugin_dir, fixture_host.host, DevicesSpec(interfaces=[nic("eth0", "0000:03:00.0")])
    )
    try:
        for resource in (EXCLUSIVE, SHARED, PARTITIONED):
            await r.kubelet.wait_registered(resource)
            assert await r.kubelet.wait_devices(resource) == []
    finally:
        await shutdown(r)


async def test_switches_drop_families_and_domain_is_configurable(
    plugin_dir: str, fixture_host: FixtureHost
) -> None:
    config = PluginConfig(domain="example.com", shared=False, partitioned=False)
    r = await start_plugin(plugin_dir, fixture_host.host, two_nics_and_vfs(), config)
    try:
        await asyncio.wait_for(r.manager.serving.wait(), timeout=30)
        assert sorted(r.kubelet.resources) == ["device.example.com/rdma"]
        assert len(await r.kubelet.wait_devices("device.example.com/rdma")) == 2
    finally:
        await shutdown(r)


async def test_waits_for_the_first_record_before_registering(
    plugin_dir: str, fixture_host: FixtureHost
) -> None:
    r = await start_plugin(plugin_dir, fixture_host.host, None)
    try:
        await asyncio.sleep(0.1)
        assert r.kubelet.resources == {}
        r.source.update(two_nics_and_vfs())
        await r.kubelet.wait_registered(EXCLUSIVE)
        assert len(await r.kubelet.wait_devices(EXCLUSIVE)) == 2
    finally:
        await shutdown(r)


async def test_a_refused_registration_is_retried(plugin_dir: str, fixture_host: FixtureHost) -> None:
    kubelet = KubeletEmulator(plugin_dir)
    await kubelet.start()
    kubelet.refuse[EXCLUSIVE] = "resource already registered"
    before = metrics.REGISTRATIONS.labels("rdma", "failed")._value.get()
    r = await start_plugin(plugin_dir, fixture_host.host, two_nics_and_vfs(), kubelet=kubelet)
    try:
        await kubelet.wait_registered(SHARED)
        await kubelet.wait_for(lambda: metrics.REGISTRATIONS.labels("rdma", "failed")._value.get() > before)
        assert kubelet.registrations(EXCLUSIVE) == 0
        del kubelet.refuse[EXCLUSIVE]
        await kubelet.wait_registered(EXCLUSIVE)
    finally:
        await shutdown(r)


async def test_registers_once_kubelet_appears(plugin_dir: str, fixture_host: FixtureHost) -> None:
    kubelet = KubeletEmulator(plugin_dir)
    r = await start_plugin(plugin_dir, fixture_host.host, two_nics_and_vfs(), kubelet=kubelet)
    try:
        await asyncio.sleep(0.1)
        await kubelet.start()
        await kubelet.wait_registered(EXCLUSIVE)
    finally:
        await shutdown(r)


async def test_clean_shutdown_removes_our_sockets(plugin_dir: str, fixture_host: FixtureHost) -> None:
    r = await start_plugin(plugin_dir, fixture_host.host, two_nics_and_vfs())
    await asyncio.wait_for(r.manager.serving.wait(), timeout=30)
    r.stop.set()
    await asyncio.wait_for(r.task, timeout=30)
    assert sorted(os.listdir(plugin_dir)) == ["kubelet.sock"]
    await r.kubelet.stop()


async def test_no_numa_hint_when_neither_endpoint_nor_parent_knows(
    plugin_dir: str, fixture_host: FixtureHost
) -> None:
    spec = DevicesSpec(
        interfaces=[
            nic("ens1f0", "0000:19:00.0", "mlx5_0"),
            nic("ens3f0", "0000:86:00.0", "mlx5_2", vfs=[vf("0000:86:00.1", "mlx5_3")]),
        ]
    )
    r = await start_plugin(plugin_dir, fixture_host.host, spec)
    try:
        (whole,) = await r.kubelet.wait_devices(EXCLUSIVE)
        (part,) = await r.kubelet.wait_devices(PARTITIONED)
        # No TopologyInfo at all: never ID -1 and never a stand-in node 0.
        assert not whole.HasField("topology")
        assert not part.HasField("topology")
    finally:
        await shutdown(r)


async def test_metrics_are_exposed_with_conventional_names(running: Running) -> None:
    from prometheus_client import generate_latest

    await running.kubelet.wait_devices(EXCLUSIVE, lambda ds: len(ds) == 2)
    await running.kubelet.plugin(EXCLUSIVE).allocate(["0000:19:00.0"])
    text = generate_latest().decode()
    assert 'nodefabric_deviceplugin_allocations_total{family="rdma",outcome="granted"}' in text
    assert 'nodefabric_deviceplugin_registrations_total{family="rdma.shared",outcome="ok"}' in text
    assert 'nodefabric_deviceplugin_devices{family="rdma",health="healthy"} 2.0' in text


async def test_a_socket_path_that_cannot_be_bound_is_retried(
    plugin_dir: str, fixture_host: FixtureHost
) -> None:
    blocker = os.path.join(plugin_dir, "nodefabric-rdma.sock")
    os.makedirs(os.path.join(blocker, "inside"))
    r = await start_plugin(plugin_dir, fixture_host.host, two_nics_and_vfs())
    try:
        await r.kubelet.wait_registered(SHARED)
        assert r.kubelet.registrations(EXCLUSIVE) == 0
        os.rmdir(os.path.join(blocker, "inside"))
        os.rmdir(blocker)
        await r.kubelet.wait_registered(EXCLUSIVE)
    finally:
        await shutdown(r)


async def test_the_device_list_log_names_the_unhealthy_endpoint_and_its_ports(
    running: Running, caplog: pytest.LogCaptureFixture
) -> None:
    await running.kubelet.wait_devices(EXCLUSIVE, lambda ds: len(ds) == 2)
    caplog.set_level(logging.INFO, logger="nodefabric_deviceplugin")
    spec = two_nics_and_vfs()
    reason = "mlx5_0: port 1 state '1: DOWN' phys_state '3: Disabled'"
    spec.interfaces[1].link = LinkVerdict(state=LinkState.FAILED, reason=reason)
    running.source.update(spec)

    def down(devices: list[pb.Device]) -> bool:
        return any(d.health == "Unhealthy" for d in devices)

    await running.kubelet.wait_devices(EXCLUSIVE, down)
    sent = [
        r
        for r in caplog.records
        if r.getMessage() == "sending the device list" and getattr(r, "resource", "") == EXCLUSIVE
    ]
    assert sent and getattr(sent[-1], "unhealthy", None) == [f"mlx5_0 ({reason})"]
