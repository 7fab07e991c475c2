"""Hostile hosts and records through the real gRPC service: a blocking sysfs file, values that are not
what they claim, requests and lists too big for kubelet. Each test says what the plugin does instead of
hanging, inventing a value or ending a stream."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

import grpc
import pytest
from dp_helpers import (
    FixtureHost,
    Running,
    by_id,
    eventually,
    hint,
    nic,
    shutdown,
    start_plugin,
    thousand_vfs,
    two_nics_and_vfs,
)

from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import DevicesSpec, Interface, LinkState, LinkVerdict
from nodefabric_devicemanager.numbers import numa_node
from nodefabric_deviceplugin import wire
from nodefabric_deviceplugin.api import deviceplugin_pb2 as pb
from nodefabric_deviceplugin.limits import KUBELET_MAX_MESSAGE_BYTES
from nodefabric_deviceplugin.resources import Family, FamilyView, PluginConfig
from nodefabric_deviceplugin.verbs import VerbsCache, VerbsTable, read_table

EXCLUSIVE = "device.gpustack.ai/rdma"
SHARED = "device.gpustack.ai/rdma.shared"
PARTITIONED = "device.gpustack.ai/rdma.partitioned"


@contextlib.contextmanager
def fifo_at(path: Path, answer: bytes) -> Iterator[None]:
    """A FIFO where a sysfs attribute should be. On exit a reader still blocked on it gets `answer`, so
    no thread of the test process stays stuck (the host reader may also refuse it without opening)."""
    path.unlink()
    os.mkfifo(path)
    try:
        yield
    finally:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            assert exc.errno == errno.ENXIO  # nobody is reading it: nothing to release
        else:
            os.write(fd, answer)
            os.close(fd)


async def test_a_fifo_in_the_verbs_class_never_blocks_other_rpcs(
    plugin_dir: str, fixture_host: FixtureHost
) -> None:
    ibdev = fixture_host.builder.functions["0000:19:00.0"] / "infiniband_verbs" / "uverbs7" / "ibdev"
    with fifo_at(ibdev, b"mlx5_0\n"):
        r = await start_plugin(plugin_dir, fixture_host.host, two_nics_and_vfs(), read_budget=0.5)
        try:
            await asyncio.wait_for(r.manager.serving.wait(), 30)
            plugin = r.kubelet.plugin(EXCLUSIVE)
            allocate = asyncio.ensure_future(plugin.allocate(["0000:19:00.0"], timeout=30))
            # While that Allocate's read is stuck (or being refused), everything else is answered.
            for _ in range(3):
                assert (await plugin.options(timeout=5)).get_preferred_allocation_available
                assert await plugin.preferred(["0000:5e:00.0", "0000:19:00.0"], [], 1, timeout=5) == [
                    "0000:19:00.0"
                ]
            spec = two_nics_and_vfs()
            spec.interfaces[2].link = LinkVerdict(state=LinkState.FAILED, reason="test")
            r.source.update(spec)
            await r.kubelet.wait_devices(
                EXCLUSIVE, lambda ds: by_id(ds)["0000:5e:00.0"].health == "Unhealthy", timeout=5
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await allocate
            # Without the host reader's own refusal of non-regular files the read blocks and the budget
            # ends the call; with it, the read is refused at once. Either way: a clear status, no hang.
            code, details = err.value.code(), err.value.details() or ""
            assert (code, "did not finish within 0.5 s" in details) == (
                grpc.StatusCode.UNAVAILABLE,
                True,
            ) or (code == grpc.StatusCode.FAILED_PRECONDITION and "mlx5_0" in details), (code, details)
        finally:
            await shutdown(r)


async def test_a_stuck_verbs_read_fails_allocate_after_its_budget_and_runs_once(
    plugin_dir: str, fixture_host: FixtureHost
) -> None:
    release = threading.Event()

    def stuck(host: HostRoot, names: Iterable[str]) -> VerbsTable:
        # What a read blocked in a driver (a firmware reset holding its lock) looks like from here.
        release.wait(60)
        return read_table(host, names)

    verbs = VerbsCache(fixture_host.host, budget=0.2, reader=stuck)
    r = await start_plugin(plugin_dir, fixture_host.host, two_nics_and_vfs(), verbs=verbs)
    try:
        await asyncio.wait_for(r.manager.serving.wait(), 30)
        plugin = r.kubelet.plugin(EXCLUSIVE)
        for _ in range(3):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await plugin.allocate(["0000:19:00.0"], timeout=30)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "reading /sys/class/infiniband_verbs did not finish within 0.2 s" in (
                err.value.details() or ""
            )
            assert (await plugin.options(timeout=5)).get_preferred_allocation_available
        assert verbs.reads == 1, "callers share the read in flight instead of starting one each"
        release.set()
        response = await plugin.allocate(["0000:19:00.0"], timeout=30)
        assert [d.host_path for d in response.container_responses[0].devices] == [
            "/dev/infiniband/uverbs7",
            "/dev/infiniband/rdma_cm",
        ]
    finally:
        release.set()
        await shutdown(r)


NUMA_VALUES = [
    "0",
    "1",
    "1023",
    "١",  # noqa: RUF001 (an Arabic-Indic digit one: int() reads it as 1, the kernel never prints it)
    "²",
    "1" * 23,
    "01",
    " 1",
    "1\n",
    "-1",
    "abc",
    "1e3",
    "1024",
    "-9000",
    "",
]


async def test_numa_values_follow_the_operators_parser_and_end_no_stream(
    plugin_dir: str, fixture_host: FixtureHost
) -> None:
    def record(values: list[str]) -> DevicesSpec:
        return DevicesSpec(
            interfaces=[
                nic(f"e{i}", f"0000:{0x20 + i:02x}:00.0", f"mlx5_{i}", numa=v) for i, v in enumerate(values)
            ]
        )

    r = await start_plugin(plugin_dir, fixture_host.host, record(["0"] * len(NUMA_VALUES)))
    try:
        await r.kubelet.wait_devices(EXCLUSIVE, lambda ds: len(ds) == len(NUMA_VALUES))
        r.source.update(record(NUMA_VALUES))  # on the open stream
        devices = await r.kubelet.wait_devices(
            EXCLUSIVE, lambda ds: hint(by_id(ds)["0000:21:00.0"]) == [1], timeout=10
        )
        got = {d.ID: hint(d) for d in devices}
        for i, value in enumerate(NUMA_VALUES):
            expected = numa_node(value)
            assert got[f"0000:{0x20 + i:02x}:00.0"] == (None if expected is None else [expected]), repr(value)
        state = r.kubelet.resources[EXCLUSIVE]
        assert not state.stream_ended
        assert state.allocatable == len(NUMA_VALUES), "a bad NUMA value is a missing hint, not a sick device"
    finally:
        await shutdown(r)


async def test_bad_facts_of_one_endpoint_leave_the_rest_served(
    plugin_dir: str, fixture_host: FixtureHost
) -> None:
    r = await start_plugin(plugin_dir, fixture_host.host, two_nics_and_vfs())
    try:
        await r.kubelet.wait_devices(EXCLUSIVE, lambda ds: len(ds) == 2)
        spec = DevicesSpec(
            interfaces=[
                nic("ens1f0", "0000:19:00.0", "mlx5_0", numa="0"),
                # A bus id with a trailing newline is not a bus id: never put into a kubelet id.
                nic("ens2f0", "0000:5e:00.0\n", "mlx5_1", numa="1"),
                # NCCL reads "," as a list separator: this name cannot be handed out correctly.
                nic("ens3f0", "0000:86:00.0", "mlx5,2", numa="1"),
                nic("ens4f0", "garbage", "mlx5_3"),
            ]
        )
        r.source.update(spec)
        devices = by_id(await r.kubelet.wait_devices(EXCLUSIVE, lambda ds: len(ds) == 4))
        assert {k: v.health for k, v in devices.items()} == {
            "0000:19:00.0": "Healthy",
            "0000:86:00.0": "Unhealthy",
            "rdma-mlx5_1": "Healthy",
            "rdma-mlx5_3": "Healthy",
        }
        assert not r.kubelet.resources[EXCLUSIVE].stream_ended
        plugin = r.kubelet.plugin(EXCLUSIVE)
        ok = await plugin.allocate(["0000:19:00.0"])
        assert ok.container_responses[0].envs["NCCL_IB_HCA"] == "=mlx5_0"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await plugin.allocate(["0000:86:00.0"])
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "not a valid RDMA device name" in (err.value.details() or "")
    finally:
        await shutdown(r)


async def test_a_ten_thousand_id_allocate_gets_a_bounded_invalid_argument(
    running: Running, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="nodefabric_deviceplugin")
    ids = [f"0000:{i // 256 % 256:02x}:{i % 256:02x}.7" for i in range(10_000)]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await running.kubelet.plugin(EXCLUSIVE).allocate(ids)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = err.value.details() or ""
    assert len(details) < 600 and "(10000 in all)" in details and ids[0] in details
    (refusal,) = [rec for rec in caplog.records if rec.getMessage() == "allocation refused"]
    assert len(str(refusal.devices)) < 600  # type: ignore[attr-defined]


async def test_a_ten_thousand_token_shared_allocate_is_one_endpoint(running: Running) -> None:
    await running.kubelet.wait_devices(SHARED)
    response = await running.kubelet.plugin(SHARED).allocate(["0000:19:00.0-1"] * 10_000)
    assert response.container_responses[0].envs["NCCL_IB_HCA"] == "=mlx5_0"


async def test_a_shared_list_over_kubelets_limit_is_clamped_not_dropped(
    plugin_dir: str, fixture_host: FixtureHost, caplog: pytest.LogCaptureFixture
) -> None:
    # 1500 passes the start-up check (planned for 32 endpoints); 100 endpoints would make 5.1 MiB.
    caplog.set_level(logging.ERROR, logger="nodefabric_deviceplugin")
    nics = [nic(f"e{i}", f"0000:{0x10 + i:02x}:00.0", f"mlx5_{i}", numa=str(i % 2)) for i in range(100)]
    config = PluginConfig(shared_count=1500, partitioned=False)
    r = await start_plugin(plugin_dir, fixture_host.host, DevicesSpec(interfaces=nics), config)
    try:
        devices = await r.kubelet.wait_devices(SHARED, lambda ds: len(ds) > 0, timeout=60)
        per_endpoint = len(devices) // 100
        assert len(devices) == 100 * per_endpoint and 0 < per_endpoint < 1500
        size = pb.ListAndWatchResponse(devices=devices).ByteSize()
        # As many as fit: one more token per endpoint would not.
        assert KUBELET_MAX_MESSAGE_BYTES - 100 * 40 < size <= KUBELET_MAX_MESSAGE_BYTES
        assert not r.kubelet.resources[SHARED].stream_ended
        assert any("4 MiB" in rec.getMessage() for rec in caplog.records)
        # The last served token is allocatable; the first one past the clamp is not a token.
        plugin = r.kubelet.plugin(SHARED)
        last = await plugin.allocate([f"0000:10:00.0-{per_endpoint - 1}"])
        assert last.container_responses[0].envs["NCCL_IB_HCA"] == "=mlx5_0"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await plugin.allocate([f"0000:10:00.0-{per_endpoint}"])
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        await shutdown(r)


async def test_a_preferred_allocation_over_a_hundred_thousand_shared_tokens_answers(
    plugin_dir: str, fixture_host: FixtureHost
) -> None:
    # kubelet sends every free token, and a pod may ask for half of them: the answer must not cost a look
    # through the chosen ones per candidate (minutes on the event loop, every stream stalled meanwhile).
    nics = [nic(f"e{i}", f"0000:{0x10 + i:02x}:00.0", f"mlx5_{i}", numa=str(i % 2)) for i in range(100)]
    config = PluginConfig(shared_count=1500, partitioned=False)
    r = await start_plugin(plugin_dir, fixture_host.host, DevicesSpec(interfaces=nics), config)
    try:
        ids = [d.ID for d in await r.kubelet.wait_devices(SHARED, lambda ds: len(ds) > 0, timeout=60)]
        assert len(ids) > 100_000
        must = ids[: len(ids) // 4]
        chosen = await r.kubelet.plugin(SHARED).preferred(ids, must, len(ids) // 2, timeout=30)
        assert chosen[: len(must)] == must
        assert len(chosen) == len(set(chosen)) == len(ids) // 2 and set(chosen) <= set(ids)
        # No opinion is lost on the way: the rest still spreads over the endpoints the must ones leave.
        fresh = {i.rsplit("-", 1)[0] for i in chosen[len(must) :]}
        assert fresh - {i.rsplit("-", 1)[0] for i in must}
    finally:
        await shutdown(r)


async def test_a_long_preferred_allocation_leaves_the_other_rpcs_answering(
    plugin_dir: str, fixture_host: FixtureHost
) -> None:
    # 64 PFs behind their own ports, 16 VFs each: the greedy walk over 64 placements costs seconds for a
    # request of nearly every VF. Meanwhile kubelet's other calls (another pod's Allocate, the options
    # it asks at each registration) must be answered, not queued behind it.
    r = await start_plugin(plugin_dir, fixture_host.host, thousand_vfs(pfs=64, per_pf=16))
    try:
        ids = [d.ID for d in await r.kubelet.wait_devices(PARTITIONED, lambda ds: len(ds) == 1024)]
        plugin = r.kubelet.plugin(PARTITIONED)
        long = asyncio.create_task(plugin.preferred(ids, [], len(ids) - 1, timeout=120))
        await asyncio.sleep(0.2)  # the request reaches the plugin (sooner only weakens the check)
        assert (await plugin.options(timeout=60)).get_preferred_allocation_available
        assert not long.done(), "the options call waited for the preferred allocation"
        chosen = await long
        assert len(set(chosen)) == len(ids) - 1 and set(chosen) <= set(ids)
    finally:
        await shutdown(r)


async def test_a_preferred_allocation_without_a_thread_to_be_had_still_answers(
    plugin_dir: str, fixture_host: FixtureHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = await start_plugin(plugin_dir, fixture_host.host, thousand_vfs(pfs=2, per_pf=4))
    try:
        ids = [d.ID for d in await r.kubelet.wait_devices(PARTITIONED, lambda ds: len(ds) == 8)]
        real_start = threading.Thread.start

        def start(self: threading.Thread) -> None:
            if self.name == "a preferred allocation":
                raise RuntimeError("can't start new thread")  # the process at its thread limit
            real_start(self)

        monkeypatch.setattr(threading.Thread, "start", start)
        chosen = await r.kubelet.plugin(PARTITIONED).preferred(ids, [], 4)
        assert len(set(chosen)) == 4 and set(chosen) <= set(ids)
    finally:
        monkeypatch.undo()
        await shutdown(r)


def _platform_verbs(fixture_host: FixtureHost, device: str, n: int) -> None:
    """A verbs device for an RDMA device off the PCI bus (an SoC's NIC, or rxe over any netdev)."""
    b = fixture_host.builder
    d = b.mkdir(f"/sys/devices/virtual/infiniband_verbs/uverbs{n}")
    b.attrs(d, {"ibdev": device, "abi_version": "1", "dev": f"231:{192 + n}"})
    b.link(f"/sys/class/infiniband_verbs/uverbs{n}", d)
    b.write(f"/dev/infiniband/uverbs{n}", "")


async def test_platform_rdma_is_served_under_stable_ids_and_software_rdma_is_not(
    plugin_dir: str, fixture_host: FixtureHost
) -> None:
    _platform_verbs(fixture_host, "hns_0", 10)
    _platform_verbs(fixture_host, "hns_1", 11)
    _platform_verbs(fixture_host, "rxe0", 12)
    ok = LinkVerdict(state=LinkState.OK)
    spec = DevicesSpec(
        interfaces=[
            Interface(
                name="end0", bus="platform", rdma=True, rdma_device="hns_0", numa_affinity="0", link=ok
            ),
            Interface(name="end1", bus="platform", rdma=True, rdma_device="hns_1", link=ok),
            Interface(name="end2", bus="platform", rdma=True, rdma_device="hns 2", link=ok),
            # Soft-RoCE over a virtio NIC: recorded, but the node is not RDMA capable by it.
            Interface(name="eth0", bus="virtio", rdma=True, rdma_device="rxe0", rdma_software=True, link=ok),
            nic("ens1f0", "0000:19:00.0", "mlx5_0", numa="0"),
        ]
    )
    r = await start_plugin(plugin_dir, fixture_host.host, spec, PluginConfig(shared_count=2))
    try:
        exclusive = by_id(await r.kubelet.wait_devices(EXCLUSIVE, lambda ds: len(ds) == 4))
        odd = next(i for i in exclusive if i.startswith("rdma-hns-2-"))
        assert sorted(exclusive) == sorted(["0000:19:00.0", "rdma-hns_0", "rdma-hns_1", odd])
        assert all(len(i) <= 63 for i in exclusive)
        assert hint(exclusive["rdma-hns_0"]) == [0] and hint(exclusive["rdma-hns_1"]) is None
        assert exclusive[odd].health == "Unhealthy"  # a space: no kernel name, no NCCL_IB_HCA entry
        shared = {d.ID for d in await r.kubelet.wait_devices(SHARED, lambda ds: len(ds) == 8)}
        assert {"rdma-hns_0-0", "rdma-hns_0-1", "rdma-hns_1-0", "rdma-hns_1-1"} <= shared
        assert not any("rxe" in i for i in shared)
        response = await r.kubelet.plugin(EXCLUSIVE).allocate(["rdma-hns_0", "rdma-hns_1"])
        (container,) = response.container_responses
        assert [d.host_path for d in container.devices] == [
            "/dev/infiniband/uverbs10",
            "/dev/infiniband/uverbs11",
            "/dev/infiniband/rdma_cm",
        ]
        assert container.envs["NCCL_IB_HCA"] == "=hns_0,hns_1"
        # The same ids from the same record in another order, and after a restart of the plugin.
        spec.interfaces.reverse()
        r.source.update(spec)
        again = await r.kubelet.wait_devices(EXCLUSIVE, lambda ds: len(ds) == 4)
        assert sorted(d.ID for d in again) == sorted(exclusive)
    finally:
        await shutdown(r)


async def test_a_vf_listed_at_top_level_is_a_partition_never_a_whole_function(
    plugin_dir: str, fixture_host: FixtureHost
) -> None:
    spec = DevicesSpec(
        interfaces=[
            nic("ens1f0", "0000:19:00.0", "mlx5_0", numa="0"),
            # The PF 0000:86:00.0 has no host netdev (moved into a pod): its VFs are listed at top level.
            Interface(
                bus="pci",
                pci_bus_id="0000:86:00.2",
                rdma=True,
                rdma_device="mlx5_4",
                physical_function="0000:86:00.0",
            ),
            # This VF's PF is in the record: its NUMA node is the hint.
            nic("ens2f0", "0000:5e:00.0", "mlx5_1", numa="1"),
            Interface(
                name="ens2f0v0",
                bus="pci",
                pci_bus_id="0000:5e:00.1",
                rdma=True,
                rdma_device="mlx5_3",
                physical_function="0000:5e:00.0",
            ),
        ]
    )
    r = await start_plugin(plugin_dir, fixture_host.host, spec)
    try:
        exclusive = await r.kubelet.wait_devices(EXCLUSIVE)
        assert sorted(d.ID for d in exclusive) == ["0000:19:00.0", "0000:5e:00.0"]
        shared = await r.kubelet.wait_devices(SHARED)
        assert not [d.ID for d in shared if d.ID.startswith(("0000:86:", "0000:5e:00.1"))]
        partitioned = by_id(await r.kubelet.wait_devices(PARTITIONED, lambda ds: len(ds) == 2))
        assert sorted(partitioned) == ["0000:5e:00.1", "0000:86:00.2"]
        assert hint(partitioned["0000:5e:00.1"]) == [1]
        assert hint(partitioned["0000:86:00.2"]) is None
        response = await r.kubelet.plugin(PARTITIONED).allocate(["0000:86:00.2"])
        assert [d.host_path for d in response.container_responses[0].devices] == [
            "/dev/infiniband/uverbs5",
            "/dev/infiniband/rdma_cm",
        ]
    finally:
        await shutdown(r)


async def test_a_record_that_cannot_be_listed_keeps_the_last_list_and_the_stream(
    running: Running, caplog: pytest.LogCaptureFixture
) -> None:
    await running.kubelet.wait_devices(EXCLUSIVE, lambda ds: len(ds) == 2)
    caplog.set_level(logging.ERROR, logger="nodefabric_deviceplugin")
    spec = two_nics_and_vfs()
    # Not something the models allow: a record built around their validation, as a bug elsewhere might.
    object.__setattr__(spec.interfaces[1], "numa_affinity", 7)
    running.source.update(spec)
    await eventually(
        lambda: any("could not build the device list" in rec.getMessage() for rec in caplog.records)
    )
    state = running.kubelet.resources[EXCLUSIVE]
    assert not state.stream_ended and len(state.devices) == 2
    running.source.update(two_nics_and_vfs())
    running.source.update(DevicesSpec(interfaces=[nic("ens1f0", "0000:19:00.0", "mlx5_0")]))
    assert len(await running.kubelet.wait_devices(EXCLUSIVE, lambda ds: len(ds) == 1)) == 1


async def test_a_preferred_allocation_over_a_thousand_vfs_answers(
    plugin_dir: str, fixture_host: FixtureHost
) -> None:
    r = await start_plugin(plugin_dir, fixture_host.host, thousand_vfs())
    try:
        ids = [d.ID for d in await r.kubelet.wait_devices(PARTITIONED, lambda ds: len(ds) == 1024)]
        chosen = await r.kubelet.plugin(PARTITIONED).preferred(ids, [], 512, timeout=30)
        assert len(set(chosen)) == 512 and set(chosen) <= set(ids)
        assert (await r.kubelet.plugin(EXCLUSIVE).options(timeout=5)).get_preferred_allocation_available
    finally:
        await shutdown(r)


async def test_while_the_shared_list_at_kubelets_limit_is_built_the_other_calls_answer(
    plugin_dir: str, fixture_host: FixtureHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rdma.shared at kubelet's 4 MiB limit is some 123,000 tokens, over a second of CPU to build for each
    record. Every family's calls and streams share the event loop (the agent's DRA driver too): the
    build must not hold them. Here it is held mid-way until another family's Allocate and the options
    kubelet asks have answered; a build on the loop would hold them until it was let go."""
    nics = [nic(f"e{i}", f"0000:{0x10 + i:02x}:00.0", f"mlx5_{i}", numa=str(i % 2)) for i in range(100)]
    config = PluginConfig(shared_count=1500, partitioned=False)
    r = await start_plugin(plugin_dir, fixture_host.host, DevicesSpec(interfaces=nics), config)
    try:
        first = await r.kubelet.wait_devices(SHARED, lambda ds: len(ds) > 100_000, timeout=60)
        await r.kubelet.wait_devices(EXCLUSIVE, lambda ds: len(ds) == len(nics), timeout=60)
        entered, release = threading.Event(), threading.Event()
        order: list[str] = []
        real = wire.device_list

        def held(current: FamilyView) -> pb.ListAndWatchResponse:
            if current.family is Family.SHARED:
                entered.set()
                # A deadlock breaker, not a measure: on the loop, nothing below could let it go.
                order.append("list built" if release.wait(10) else "list built, never let go")
            return real(current)

        monkeypatch.setattr(wire, "device_list", held)
        r.source.update(DevicesSpec(interfaces=nics[:-1]))  # every family builds its list again
        assert await asyncio.to_thread(entered.wait, 30)
        assert (await r.kubelet.plugin(SHARED).options(timeout=30)).get_preferred_allocation_available
        granted = await r.kubelet.plugin(EXCLUSIVE).allocate(["0000:10:00.0"], timeout=30)
        assert granted.container_responses[0].envs["NCCL_IB_HCA"] == "=mlx5_0"
        order.append("answered")
        release.set()
        again = await r.kubelet.wait_devices(SHARED, lambda ds: len(ds) != len(first), timeout=60)
        assert order == ["answered", "list built"]
        # The list is what it always was: every remaining endpoint's tokens, fitted to kubelet's limit.
        assert {d.ID.rsplit("-", 1)[0] for d in again} == {n.pci_bus_id for n in nics[:-1]}
    finally:
        await shutdown(r)


async def test_a_record_changing_while_its_list_is_built_builds_one_list_at_a_time(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record changing while a list is built (a link flapping) with calls arriving (each pod start's
    GetPreferredAllocation and Allocate): each call of another record version started a build of its
    own beside the one running, a list of up to 4 MiB and over a second of CPU each, all at once, most
    for records already replaced. One build at a time: the calls wait for the one running, then share
    one build of the record latest then; the stream ends on the latest record's list."""
    await running.kubelet.wait_devices(EXCLUSIVE, lambda ds: len(ds) == 2)
    release, lock = threading.Event(), threading.Lock()
    entered = threading.Semaphore(0)
    active, peak = [0], [0]
    real = wire.device_list

    def held(current: FamilyView) -> pb.ListAndWatchResponse:
        if current.family is Family.EXCLUSIVE:
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            entered.release()
            release.wait(10)  # a deadlock breaker, not a measure
            with lock:
                active[0] -= 1
        return real(current)

    monkeypatch.setattr(wire, "device_list", held)

    def record(numa: str, *, more: bool = False) -> DevicesSpec:
        nics = [nic("ens1f0", "0000:19:00.0", "mlx5_0", numa=numa)]
        if more:
            nics.append(nic("ens2f0", "0000:5e:00.0", "mlx5_1", numa=numa))
        return DevicesSpec(interfaces=nics)

    running.source.update(record("0"))  # the stream's build, held
    assert await asyncio.to_thread(entered.acquire, True, 30)
    calls = []
    for numa in ("1", "0", "1"):
        running.source.update(record(numa))
        calls.append(
            asyncio.ensure_future(running.kubelet.plugin(EXCLUSIVE).allocate(["0000:19:00.0"], timeout=30))
        )
    running.source.update(record("0", more=True))
    await asyncio.sleep(0.5)  # the calls reach the plugin (the length of the attack, not a wait for a result)
    release.set()
    for granted in await asyncio.gather(*calls):
        assert granted.container_responses[0].envs["NCCL_IB_HCA"] == "=mlx5_0"
    latest = await running.kubelet.wait_devices(EXCLUSIVE, lambda ds: len(ds) == 2)
    assert {d.ID for d in latest} == {"0000:19:00.0", "0000:5e:00.0"}
    assert peak[0] == 1


async def test_a_device_list_without_a_thread_to_be_had_is_still_built_and_sent(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process at its thread limit: the list is built on the loop instead, the stream and Allocate
    answer from the latest record all the same."""
    await running.kubelet.wait_devices(EXCLUSIVE, lambda ds: len(ds) == 2)
    real_start = threading.Thread.start
    refused: list[str] = []

    def start(self: threading.Thread) -> None:
        if self.name.endswith("device list"):
            refused.append(self.name)
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    running.source.update(DevicesSpec(interfaces=[nic("ens1f0", "0000:19:00.0", "mlx5_0")]))
    assert len(await running.kubelet.wait_devices(EXCLUSIVE, lambda ds: len(ds) == 1)) == 1
    granted = await running.kubelet.plugin(EXCLUSIVE).allocate(["0000:19:00.0"])
    assert granted.container_responses[0].envs["NCCL_IB_HCA"] == "=mlx5_0"
    assert f"the {EXCLUSIVE} device list" in refused


async def test_the_plugin_stops_while_a_device_list_is_being_built(
    plugin_dir: str, fixture_host: FixtureHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop (SIGTERM) while a list is built, and calls waiting for it: the stop does not wait for the
    build, and the build ending afterwards disturbs nothing."""
    r = await start_plugin(plugin_dir, fixture_host.host, two_nics_and_vfs())
    await r.kubelet.wait_devices(EXCLUSIVE, lambda ds: len(ds) == 2)
    entered, release = threading.Event(), threading.Event()
    real = wire.device_list

    def held(current: FamilyView) -> pb.ListAndWatchResponse:
        if current.family is Family.EXCLUSIVE:
            entered.set()
            release.wait(30)  # a deadlock breaker, not a measure
        return real(current)

    monkeypatch.setattr(wire, "device_list", held)
    try:
        r.source.update(DevicesSpec(interfaces=[nic("ens1f0", "0000:19:00.0", "mlx5_0")]))
        assert await asyncio.to_thread(entered.wait, 30)
        waiting = asyncio.ensure_future(r.kubelet.plugin(EXCLUSIVE).allocate(["0000:19:00.0"], timeout=30))
        r.source.update(two_nics_and_vfs())
        r.stop.set()
        await asyncio.wait_for(r.task, 20)  # not after the build: it is still held here
        assert not release.is_set()
        with pytest.raises(grpc.aio.AioRpcError):
            await waiting
    finally:
        release.set()
        await r.kubelet.stop()


async def test_many_streams_share_one_build_per_record_and_each_ends_on_the_latest(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thirty-two streams open at once (kubelet's, and others dialling the socket): each record change is
    built once for all of them, and every stream's last list is the latest record's."""
    await running.kubelet.wait_devices(EXCLUSIVE, lambda ds: len(ds) == 2)
    builds: list[int] = []
    real = wire.device_list

    def counted(current: FamilyView) -> pb.ListAndWatchResponse:
        if current.family is Family.EXCLUSIVE:
            builds.append(len(current.tokens))
        return real(current)

    monkeypatch.setattr(wire, "device_list", counted)
    plugin = running.kubelet.plugin(EXCLUSIVE)
    streams = [plugin.list_and_watch() for _ in range(32)]
    try:
        for stream in streams:
            assert len((await stream.read()).devices) == 2  # type: ignore[union-attr]
        running.source.update(DevicesSpec(interfaces=[nic("ens1f0", "0000:19:00.0", "mlx5_0")]))
        for stream in streams:
            assert [d.ID for d in (await stream.read()).devices] == ["0000:19:00.0"]  # type: ignore[union-attr]
        assert builds == [1]
    finally:
        for stream in streams:
            stream.cancel()
