"""kubelet's 4 MiB message limit: the size arithmetic against the real protobuf encoding, the start-up
check, and the test kubelet refusing an oversized list the way kubelet does."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import grpc
import pytest

from nodefabric_deviceplugin import rpc
from nodefabric_deviceplugin.api import deviceplugin_pb2 as pb
from nodefabric_deviceplugin.limits import (
    KUBELET_MAX_MESSAGE_BYTES,
    Shape,
    check_shared_count,
    device_entry_bytes,
    fitting_shared_count,
    shared_list_bytes,
)
from nodefabric_deviceplugin.testing.kubelet import PluginClient


def device(id_: str, numa: int | None, health: str) -> pb.Device:
    topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=numa)]) if numa is not None else None
    return pb.Device(ID=id_, health=health, topology=topology)


@pytest.mark.parametrize("numa", [None, 0, 1, 127, 128, 1023])
@pytest.mark.parametrize("id_length", [1, 12, 63, 127, 128, 300])
@pytest.mark.parametrize("health", ["Healthy", "Unhealthy"])
def test_one_entry_is_sized_like_protobuf(numa: int | None, id_length: int, health: str) -> None:
    message = pb.ListAndWatchResponse(devices=[device("x" * id_length, numa, health)])
    assert device_entry_bytes(id_length, numa, len(health)) == message.ByteSize()


def test_a_shared_list_is_sized_like_protobuf_across_digit_boundaries() -> None:
    shapes = [Shape(12, 0, 7), Shape(12, None, 9), Shape(40, 5, 7)]
    stems = ["0000:19:00.0", "0000:5e:00.0", "rdma-" + "x" * 35]
    for count in (0, 1, 9, 10, 11, 99, 100, 101, 1000):
        message = pb.ListAndWatchResponse(
            devices=[
                device(f"{stem}-{i}", shape.numa, "Healthy" if shape.health_length == 7 else "Unhealthy")
                for stem, shape in zip(stems, shapes, strict=True)
                for i in range(count)
            ]
        )
        assert shared_list_bytes(shapes, count) == message.ByteSize(), count


def test_the_fitting_count_is_the_largest_that_fits() -> None:
    shapes = [Shape(12, 1, 7)] * 100
    most = fitting_shared_count(shapes, 10_000)
    assert shared_list_bytes(shapes, most) <= KUBELET_MAX_MESSAGE_BYTES < shared_list_bytes(shapes, most + 1)
    assert fitting_shared_count(shapes, 64) == 64
    assert fitting_shared_count([Shape(56, 1023)] * 200_000, 10) == 0


@pytest.mark.parametrize("count", [1, 63, 500, 1000, 1500])
def test_the_ecosystems_shared_counts_pass_the_check(count: int) -> None:
    check_shared_count(count)


def test_a_shared_count_kubelet_cannot_receive_is_refused_with_its_size() -> None:
    with pytest.raises(ValueError) as err:
        check_shared_count(100_000)
    message = str(err.value)
    assert message.startswith("--shared-count 100000 would make the rdma.shared device list ")
    assert "for 32 endpoints, over kubelet's 4 MiB gRPC message limit; at most 15" in message
    with pytest.raises(ValueError, match="at least 1"):
        check_shared_count(0)
    with pytest.raises(ValueError, match="at least 1"):
        check_shared_count(-5)


class _Oversized(rpc.DevicePluginServicer):
    async def ListAndWatch(
        self, request: pb.Empty, context: object
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        yield pb.ListAndWatchResponse(devices=[device(f"{i:060d}", 1, "Healthy") for i in range(70_000)])
        await asyncio.sleep(3600)


async def test_the_test_kubelet_refuses_a_list_over_4_mib_like_kubelet(plugin_dir: str) -> None:
    path = os.path.join(plugin_dir, "big.sock")
    server = grpc.aio.server()
    rpc.add_device_plugin_servicer(_Oversized(), server)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    client = PluginClient(path)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in client.list_and_watch():
                pass
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        await client.close()
        await server.stop(None)


def test_any_list_over_the_limit_keeps_its_longest_fitting_prefix() -> None:
    from nodefabric_deviceplugin.wire import fit

    message = pb.ListAndWatchResponse(devices=[device(f"{i:060d}", 1, "Healthy") for i in range(60_000)])
    assert message.ByteSize() > KUBELET_MAX_MESSAGE_BYTES
    kept = fit(message, KUBELET_MAX_MESSAGE_BYTES)
    assert kept == len(message.devices) < 60_000
    assert message.ByteSize() <= KUBELET_MAX_MESSAGE_BYTES
    one_more = pb.ListAndWatchResponse(devices=[*message.devices, device("9" * 60, 1, "Healthy")])
    assert one_more.ByteSize() > KUBELET_MAX_MESSAGE_BYTES
    small = pb.ListAndWatchResponse(devices=[device("a", None, "Healthy")])
    assert fit(small, KUBELET_MAX_MESSAGE_BYTES) == 1
