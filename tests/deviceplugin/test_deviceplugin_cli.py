"""`nodefabric deviceplugin` standalone: reads a fixture host itself, registers, serves, stops on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest

from nodefabric_devicemanager.testing.sysfs import Port, SysfsBuilder
from nodefabric_deviceplugin.testing.kubelet import KubeletEmulator
from nodefabric_operator.console import main

NODEFABRIC = (sys.executable, "-m", "nodefabric_operator.console")


@contextlib.asynccontextmanager
async def deviceplugin(*args: str, stderr: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """`nodefabric deviceplugin ARGS` as a subprocess, killed on the way out if it is still running."""
    proc = await asyncio.create_subprocess_exec(*NODEFABRIC, "deviceplugin", *args, stderr=stderr.open("w"))
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@contextlib.asynccontextmanager
async def a_kubelet(plugin_dir: str, *, started: bool = True) -> AsyncIterator[KubeletEmulator]:
    kubelet = KubeletEmulator(plugin_dir)
    if started:
        await kubelet.start()
    try:
        yield kubelet
    finally:
        await kubelet.stop()


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
    async with (
        a_kubelet(plugin_dir) as kubelet,
        deviceplugin(
            "--root", str(tmp_path / "host"), "--plugin-dir", plugin_dir, "--shared-count", "2",
            "--no-partitioned", "--interval", "0.2", stderr=tmp_path / "stderr",
        ) as proc,
    ):  # fmt: skip
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


@pytest.mark.parametrize(
    ("flag", "says"),
    [
        (["--shared-count", "0"], "--shared-count must be at least 1"),
        # 100000 tokens for each of 32 endpoints: a list kubelet would refuse; the size is computed.
        (["--shared-count", "100000"], "MiB for 32 endpoints, over kubelet's 4 MiB gRPC message limit"),
        (["--domain", "Bad Domain"], "the domain must be a DNS subdomain"),
        (["--domain", "a" * 250], "the domain must be a DNS subdomain"),
        (["--root", "/nonexistent/root"], "the host root /nonexistent/root is not a directory"),
    ],
)
def test_a_bad_setting_is_one_line_and_exit_2(
    plugin_dir: str, flag: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["deviceplugin", "--plugin-dir", plugin_dir, *flag]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    "flag", [["--interval", "0"], ["--interval", "nan"], ["--interval", "inf"], ["--metrics-port", "70000"]]
)
def test_a_bad_flag_value_exits_2(
    plugin_dir: str, flag: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["deviceplugin", "--plugin-dir", plugin_dir, *flag])
    assert exit_.value.code == 2
    assert f"argument {flag[0]}" in capsys.readouterr().err


def test_the_shared_count_check_names_what_fits(capsys: pytest.CaptureFixture[str], plugin_dir: str) -> None:
    assert main(["deviceplugin", "--plugin-dir", plugin_dir, "--shared-count", "100000"]) == 2
    err = capsys.readouterr().err
    # 100000 x 32 endpoints x ~84 bytes: hundreds of MiB, and the largest count that fits.
    assert re.search(r"list (2[0-9]{2}\.[0-9]) MiB", err) and re.search(r"at most (15[0-9]{2}) fits", err), (
        err
    )
    assert (
        main(
            [
                "deviceplugin",
                "--plugin-dir",
                plugin_dir,
                "--shared-count",
                "100000",
                "--no-shared",
                "--root",
                "/nonexistent",
            ]
        )
        == 2
    )
    assert "shared-count" not in capsys.readouterr().err, "no rdma.shared served, no limit to check"


def test_a_plugin_dir_that_cannot_hold_sockets_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    regular = tmp_path / "file"
    regular.write_text("")
    too_long = "/tmp/" + "d" * 80
    # Bytes that are not UTF-8 (arriving as surrogates): gRPC, which takes the path as UTF-8, raised at
    # the first serve, a traceback after the plugin had started.
    not_utf8 = os.fsdecode(bytes(tmp_path / "plugins") + b"\xff")
    for plugin_dir, says in (
        (not_utf8, "is not valid UTF-8, as gRPC needs"),
        (f"{regular}/plugins", f"the plugin directory {regular}/plugins cannot be created: Not a directory"),
        (str(regular), f"the plugin directory {regular} exists and is not a directory"),
        (too_long, "unix socket paths are limited to 107"),
    ):
        assert main(["deviceplugin", "--plugin-dir", plugin_dir]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, err
    shutil.rmtree(too_long, ignore_errors=True)


def test_a_busy_metrics_port_is_one_line_and_exit_2(
    tmp_path: Path, plugin_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    build_host(tmp_path / "host")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = main(
            ["deviceplugin", "--root", str(tmp_path / "host"), "--plugin-dir", plugin_dir,
             "--bind-address", "127.0.0.1", "--metrics-port", str(port)]
        )  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].count("cannot serve metrics and health") == 1 and "Traceback" not in err
    assert '"deviceplugin cannot start"' in err.splitlines()[-1] and f"127.0.0.1 port {port}" in err


def blocked_on_fifo(pid: int) -> bool:
    """Whether a thread of `pid` waits in a FIFO's open() for a writer (the kernel's wchan says so)."""
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            if (task / "wchan").read_text() == "wait_for_partner":
                return True
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def get(port: int, path: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}", timeout=aiohttp.ClientTimeout(total=5)) as response,
    ):
        return response.status, await response.text()


async def test_probes_metrics_and_a_stuck_read_that_blocks_nothing(tmp_path: Path, plugin_dir: str) -> None:
    b = build_host(tmp_path / "host")
    ibdev = b.functions["0000:19:00.0"] / "infiniband_verbs" / "uverbs3" / "ibdev"
    ibdev.unlink()
    os.mkfifo(ibdev)  # the first Allocate's read of the verbs class blocks on it (or is refused)
    port = free_port()
    async with (
        a_kubelet(plugin_dir, started=False) as kubelet,
        deviceplugin(
            "--root", str(tmp_path / "host"), "--plugin-dir", plugin_dir, "--shared-count", "2",
            "--bind-address", "127.0.0.1", "--metrics-port", str(port), "--interval", "0.2",
            stderr=tmp_path / "stderr",
        ) as proc,
    ):  # fmt: skip
        async with asyncio.timeout(30):
            while True:
                with contextlib.suppress(aiohttp.ClientError):
                    status, text = await get(port, "/readyz")
                    if "kubelet.sock" in text:
                        break
                await asyncio.sleep(0.05)
        assert status == 503
        await kubelet.start()
        await kubelet.wait_registered("device.gpustack.ai/rdma.partitioned", timeout=30)
        async with asyncio.timeout(30):
            while (await get(port, "/readyz"))[0] != 200:
                await asyncio.sleep(0.05)

        status, metrics_text = await get(port, "/metrics")
        assert status == 200
        assert "process_cpu_seconds_total" in metrics_text and "process_resident_memory_bytes" in metrics_text
        assert "nodefabric_deviceplugin_registrations_total" in metrics_text
        assert "_created" not in metrics_text

        plugin = kubelet.plugin("device.gpustack.ai/rdma")
        allocate = asyncio.ensure_future(plugin.allocate(["0000:19:00.0"], timeout=30))
        for _ in range(5):  # while the read is stuck: probes, metrics and other RPCs answer
            assert await get(port, "/healthz") == (200, "ok\n")
            assert (await get(port, "/metrics"))[0] == 200
            assert (await plugin.options(timeout=5)).get_preferred_allocation_available
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await allocate
        assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION)

        # SIGTERM ends it promptly even with a thread still blocked in open() on the FIFO.
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=15) == 0


async def test_sigterm_ends_it_while_the_host_read_is_stuck(tmp_path: Path, plugin_dir: str) -> None:
    b = build_host(tmp_path / "host")
    mtu = b.path("/sys/class/net/ens1f0/mtu").resolve()
    mtu.unlink()
    os.mkfifo(mtu)  # the inventory's read blocks on it (or the host reader refuses it)
    stderr = tmp_path / "stderr"
    args = ("--root", str(tmp_path / "host"), "--plugin-dir", plugin_dir)
    async with deviceplugin(*args, stderr=stderr) as proc:
        # Until a thread sits in the FIFO's open, or the host reader refused the FIFO and the read ended.
        finished = ("device record changed", "could not enumerate interfaces", "reading the host failed")
        async with asyncio.timeout(30):
            while not (blocked_on_fifo(proc.pid) or any(m in stderr.read_text() for m in finished)):
                await asyncio.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=15) == 0


@pytest.mark.smoke
async def test_standalone_on_this_machine_registers_every_key(tmp_path: Path, plugin_dir: str) -> None:
    from nodefabric_devicemanager import inventory
    from nodefabric_devicemanager.hostroot import HostRoot
    from nodefabric_devicemanager.models import DevicesSpec
    from nodefabric_deviceplugin.resources import whole_function_endpoints

    interfaces = inventory.read(HostRoot.at("/")).interfaces
    assert interfaces is not None
    expected = len(whole_function_endpoints(DevicesSpec(interfaces=interfaces)))
    async with (
        a_kubelet(plugin_dir) as kubelet,
        deviceplugin("--plugin-dir", plugin_dir, stderr=tmp_path / "stderr") as proc,
    ):
        for family in ("rdma", "rdma.shared", "rdma.partitioned"):
            await kubelet.wait_registered(f"device.gpustack.ai/{family}", timeout=30)
        assert len(await kubelet.wait_devices("device.gpustack.ai/rdma", timeout=30)) == expected
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), timeout=15) == 0
