"""`nodefabric deviceplugin` standalone: reads a fixture host itself, registers, serves, stops on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from nodefabric_devicemanager.testing.sysfs import Port, SysfsBuilder
from nodefabric_deviceplugin.testing.kubelet import KubeletEmulator

NODEFABRIC = (sys.executable, "-m", "nodefabric_devicemanager.cli")


def build_host(root: Path) -> SysfsBuilder:
    b = SysfsBuilder(root)
    b.nic("0000:19:00.0", "ens1f0", numa=0, rdma="mlx5_0", verbs=3)
    b.nic("0000:5e:00.0", "ens2f0", numa=1, rdma="mlx5_1", verbs=1, ports=[Port("DOWN", "Disabled")])
    b.nic("0000:86:00.0", "ens3f0", numa=1, rdma="mlx5_2", verbs=0)
    b.sriov("0000:86:00.0", vfs=2, rdma_prefix="mlx5_", first_rdma=4, first_verbs=4)
    b.rdma_cm()
    return b


async def test_standalone_serves_the_host_and_stops_cleanly(tmp_path: Path, plugin_dir: str) -> None:
    build_host(tmp_path / "host")
    kubelet = KubeletEmulator(plugin_dir)
    await kubelet.start()
    proc = await asyncio.create_subprocess_exec(
        *NODEFABRIC, "deviceplugin",
        "--root", str(tmp_path / "host"), "--plugin-dir", plugin_dir, "--shared-count", "2",
        "--no-partitioned", "--interval", "0.2",
        stderr=(tmp_path / "stderr").open("w"),
    )  # fmt: skip
    try:
        await kubelet.wait_registered("device.gpustack.ai/rdma", timeout=30)
        await kubelet.wait_registered("device.gpustack.ai/rdma.shared", timeout=30)
        devices = await kubelet.wait_devices("device.gpustack.ai/rdma", lambda ds: len(ds) == 2, timeout=30)
        health = {d.ID: d.health for d in devices}
        assert health == {"0000:19:00.0": "Healthy", "0000:5e:00.0": "Unhealthy"}
        assert "device.gpustack.ai/rdma.partitioned" not in kubelet.resources
        response = await kubelet.plugin("device.gpustack.ai/rdma").allocate(["0000:19:00.0"])
        assert [d.host_path for d in response.container_responses[0].devices] == [
            "/dev/infiniband/uverbs3",
            "/dev/infiniband/rdma_cm",
        ]
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=15) == 0
        assert sorted(os.listdir(plugin_dir)) == ["kubelet.sock"]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await kubelet.stop()


@pytest.mark.parametrize("flag", [["--shared-count", "0"], ["--domain", "Bad Domain"], ["--interval", "0"]])
async def test_bad_configuration_exits_with_an_error(plugin_dir: str, flag: list[str]) -> None:
    proc = await asyncio.create_subprocess_exec(
        *NODEFABRIC, "deviceplugin", "--plugin-dir", plugin_dir, *flag, stderr=asyncio.subprocess.PIPE
    )
    _, err = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode == 2
    assert b"error" in err


@pytest.mark.smoke
async def test_standalone_on_this_machine_registers_every_key(tmp_path: Path, plugin_dir: str) -> None:
    from nodefabric_devicemanager import inventory
    from nodefabric_devicemanager.hostroot import HostRoot
    from nodefabric_devicemanager.models import DevicesSpec
    from nodefabric_deviceplugin.resources import whole_function_endpoints

    interfaces = inventory.read(HostRoot.at("/")).interfaces
    assert interfaces is not None
    expected = len(whole_function_endpoints(DevicesSpec(interfaces=interfaces)))
    kubelet = KubeletEmulator(plugin_dir)
    await kubelet.start()
    proc = await asyncio.create_subprocess_exec(
        *NODEFABRIC, "deviceplugin", "--plugin-dir", plugin_dir, stderr=(tmp_path / "stderr").open("w")
    )
    try:
        for family in ("rdma", "rdma.shared", "rdma.partitioned"):
            await kubelet.wait_registered(f"device.gpustack.ai/{family}", timeout=30)
        assert len(await kubelet.wait_devices("device.gpustack.ai/rdma", timeout=30)) == expected
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), timeout=15) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await kubelet.stop()
