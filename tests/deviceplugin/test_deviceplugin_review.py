"""Review fixes: what an operator reads in the plugin's logs when a link is down or the host unreadable."""

from __future__ import annotations

import asyncio
import logging

import pytest
from dp_helpers import Running, nic, scripted_reader, two_nics_and_vfs, vf

from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import DevicesSpec, Interface, LinkState, LinkVerdict
from nodefabric_deviceplugin.api import deviceplugin_pb2 as pb
from nodefabric_deviceplugin.resources import Family, view
from nodefabric_deviceplugin.source import RecordSource, poll_host

EXCLUSIVE = "device.gpustack.ai/rdma"


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


def test_efa_is_advertised_under_none_of_the_keys() -> None:
    # AWS's EFA device plugin serves vpc.amazonaws.com/efa; the same adapter must not be handed out twice.
    efa = nic("efa0", "0000:10:1c.0", "rdmap16s28", numa="0").model_copy(update={"pci_vendor": "1d0f"})
    efa_vf = vf("0000:10:1d.1", "rdmap16s29").model_copy(update={"pci_vendor": "1d0f"})
    pf = nic("ens5", "0000:10:1d.0", "", vfs=[efa_vf]).model_copy(update={"pci_vendor": "1d0f"})
    mellanox = nic("ens1f0", "0000:19:00.0", "mlx5_0", numa="0").model_copy(update={"pci_vendor": "15b3"})
    spec = DevicesSpec(interfaces=[efa, pf, mellanox])
    for family in Family:
        devices = [t.endpoint.rdma_device for t in view(spec, family, shared_count=2).tokens]
        assert not [d for d in devices if d.startswith("rdmap")], family
    assert [t.id for t in view(spec, Family.EXCLUSIVE).tokens] == ["0000:19:00.0"]
