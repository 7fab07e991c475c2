"""`nodefabric agent` as an operator runs it: `--once`, and the long-running process with its HTTP
endpoints, kernel-uevent trigger, in-process device plugin and SIGTERM."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import aiohttp
import pytest
from agent_fixtures import (
    NODE,
    api_with_node,
    conditions,
    delete_node,
    free_port,
    interface,
    nodefabric_bin,
    set_port,
    stored,
    two_nic_host,
    uevents_writable,
    writes,
)
from prometheus_client.parser import text_string_to_metric_families

from nodefabric_devicemanager.testing.sysfs import Port
from nodefabric_deviceplugin.testing.kubelet import KubeletEmulator
from nodefabric_operator.console import build_parser


async def run_once(kubeconfig: str, root: str, *extra: str) -> int:
    """The CLI path in-process (parser + run), minus the process-wide logging setup."""
    argv = ["agent", "--node-name", NODE, "--root", root, "--kubeconfig", kubeconfig, "--once", *extra]
    parser, command = build_parser(argv)
    args = parser.parse_args(argv)
    assert command is not None
    return await asyncio.to_thread(command.run, args)


async def test_once_exits_zero_when_it_wrote_or_had_nothing_to_write(tmp_path):
    two_nic_host(tmp_path)
    async with api_with_node() as k:
        assert await run_once(k.kubeconfig, str(tmp_path)) == 0
        assert stored(k) is not None
        n = len(writes(k))
        assert await run_once(k.kubeconfig, str(tmp_path)) == 0
        assert len(writes(k)) == n


async def test_once_exits_nonzero_when_the_pass_failed(tmp_path):
    two_nic_host(tmp_path)
    async with api_with_node() as k:
        await delete_node(k)
        assert await run_once(k.kubeconfig, str(tmp_path)) == 1
        assert stored(k) is None


async def test_bad_invocations_are_refused_with_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.delenv("NODE_NAME", raising=False)
    async with api_with_node() as k:
        parser, command = build_parser(["agent"])
        assert command is not None
        assert command.run(parser.parse_args(["agent", "--kubeconfig", k.kubeconfig])) == 2
        assert await run_once(k.kubeconfig, str(tmp_path / "absent")) == 2
        with pytest.raises(SystemExit):
            parser.parse_args(["agent", "--node-name", NODE, "--interval", "0"])
    assert await run_once(str(tmp_path / "no-kubeconfig"), str(tmp_path)) == 2


async def _until(predicate, timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    try:
        async with session.get(url) as resp:
            return resp.status, await resp.text()
    except aiohttp.ClientError:
        return 0, ""


async def test_the_daemon_serves_probes_metrics_the_plugin_and_stops_on_sigterm(tmp_path):
    b = two_nic_host(tmp_path / "host")
    # A unix socket path must stay under 108 bytes; pytest's tmp_path can be longer.
    plugin_dir = Path(tempfile.mkdtemp(prefix="nf-dp-", dir="/tmp"))
    metrics_port, health_port = free_port(), free_port()
    async with api_with_node() as k, aiohttp.ClientSession() as http:
        proc = await asyncio.create_subprocess_exec(
            nodefabric_bin(), "--log-format", "json", "agent", "--node-name", NODE,
            "--root", str(tmp_path / "host"), "--kubeconfig", k.kubeconfig, "--interval", "3600",
            "--debounce", "0.1", "--bind-address", "127.0.0.1", "--metrics-port", str(metrics_port),
            "--health-port", str(health_port), "--plugin-dir", str(plugin_dir),
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        kubelet = KubeletEmulator(plugin_dir)
        try:
            # The record is published, but kubelet has not accepted the resources: not ready, and it says why.
            await _until(lambda: stored(k) is not None and "status" in stored(k), what="the first pass")
            await _until(lambda: len(list(plugin_dir.glob("nodefabric-*.sock"))) == 3, what="plugin sockets")
            answers: list[tuple[int, str]] = []
            for _ in range(200):  # the pass ends a moment after its write; then only the plugin is missing
                answers.append(await _get(http, f"http://127.0.0.1:{health_port}/readyz"))
                if answers[-1][1].startswith("device plugin:"):
                    break
                await asyncio.sleep(0.1)
            assert answers[-1][0] == 503 and answers[-1][1].startswith("device plugin:"), answers[-3:]
            assert all(status != 200 for status, _ in answers), (
                "never ready before kubelet accepted the plugin"
            )
            status, _ = await _get(http, f"http://127.0.0.1:{health_port}/healthz")
            assert status == 200

            await kubelet.start()  # the device plugin notices kubelet.sock and registers

            async def poll_ready() -> None:
                while True:
                    status, _ = await _get(http, f"http://127.0.0.1:{health_port}/readyz")
                    if status == 200:
                        return
                    if proc.returncode is not None:
                        raise AssertionError("the agent exited: " + (await proc.stderr.read()).decode())
                    await asyncio.sleep(0.1)

            await asyncio.wait_for(poll_ready(), 30)
            for family in ("rdma", "rdma.shared", "rdma.partitioned"):
                assert kubelet.registrations(f"device.gpustack.ai/{family}") >= 1

            status, text = await _get(http, f"http://127.0.0.1:{metrics_port}/metrics")
            assert status == 200
            families = {f.name: f for f in text_string_to_metric_families(text)}
            for name in (
                "nodefabric_agent_passes",
                "nodefabric_agent_pass_duration_seconds",
                "nodefabric_agent_api_writes",
                "nodefabric_agent_errors",
                "nodefabric_agent_endpoints",
                "nodefabric_agent_accelerators",
            ):
                assert name in families, name
            endpoints = {s.labels["verdict"]: s.value for s in families["nodefabric_agent_endpoints"].samples}
            assert endpoints["ok"] == 2
            assert "nodefabric_deviceplugin_devices" in families, "the plugin's metrics are served too"
            build = {s.labels["component"]: s for s in families["nodefabric_build_info"].samples}
            assert {"agent", "deviceplugin"} <= set(build), build
            assert build["agent"].value == 1 and build["agent"].labels[
                "version"
            ] == importlib.metadata.version("nodefabric")
            assert "process_resident_memory_bytes" in families, "process metrics are served"
            assert "nodefabric_agent_api_response_bytes" in families
            assert not [line for line in text.splitlines() if "_created" in line], "no _created series"

            if uevents_writable():
                # With a one-hour interval, only a kernel uevent can bring the next pass.
                set_port(b, "0000:17:00.1", "mlx5_1", Port(state="DOWN", phys_state="Disabled"))
                with open("/sys/class/net/lo/uevent", "w") as f:
                    f.write("change")
                await _until(
                    lambda: interface(stored(k), "ens1f1")["link"]["state"] == "failed", what="uevent pass"
                )

            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 30) == 0
            assert not list(plugin_dir.glob("nodefabric-*.sock")), "sockets are removed on the way out"
        finally:
            await kubelet.stop()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            shutil.rmtree(plugin_dir, ignore_errors=True)
        lines = [
            json.loads(line) for line in (await proc.stderr.read()).decode().splitlines() if line.strip()
        ]
        assert any(line["msg"] == "published the devices record" and line["node"] == NODE for line in lines)
        # Every line names the node, the device plugin's and the uevent listener's too: grep node= works.
        assert [line for line in lines if line.get("node") != NODE] == []
        assert any(line["msg"] == "registered with kubelet" for line in lines)
        assert lines[-1]["msg"] == "stopped"
        assert conditions(stored(k))["InterfacesEnumerated"]["status"] == "True"


async def test_the_console_script_once_against_the_emulator(tmp_path):
    two_nic_host(tmp_path)
    async with api_with_node() as k:
        proc = await asyncio.create_subprocess_exec(
            nodefabric_bin(), "agent", "--node-name", NODE, "--root", str(tmp_path), "--once",
            env={**os.environ, "KUBERNETES_SERVICE_HOST": "", "KUBECONFIG": k.kubeconfig},
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        assert [i["name"] for i in stored(k)["spec"]["interfaces"]] == ["ens1f0", "ens1f1"]


# --- a failed enumeration is not an empty inventory, and --once says it failed --------------------------


async def test_once_on_a_new_node_with_a_dangling_net_entry_leaves_interfaces_out_and_exits_1(tmp_path):
    two_nic_host(tmp_path)
    os.symlink("../../devices/pci0000:16/0000:99:00.0/net/ens9", tmp_path / "sys/class/net/ens9")
    async with api_with_node() as k:
        assert await run_once(k.kubeconfig, str(tmp_path)) == 1
        obj = stored(k)
        assert obj is not None, "what could be read is still published"
        assert "interfaces" not in obj["spec"], obj["spec"]  # not read is not "no interfaces"
        assert "groups" in obj["spec"]  # the accelerators were read (none here), so that list is written
        cond = conditions(obj)["InterfacesEnumerated"]
        assert (cond["status"], cond["reason"]) == ("False", "EnumerationFailed")
        # The entry goes away: the next pass reads the interfaces and writes them, exit 0.
        (tmp_path / "sys/class/net/ens9").unlink()
        assert await run_once(k.kubeconfig, str(tmp_path)) == 0
        assert [i["name"] for i in stored(k)["spec"]["interfaces"]] == ["ens1f0", "ens1f1"]
        assert conditions(stored(k))["InterfacesEnumerated"]["status"] == "True"


async def test_once_on_a_new_node_without_a_pci_bus_leaves_groups_out_and_exits_1(tmp_path):
    two_nic_host(tmp_path)
    shutil.rmtree(tmp_path / "sys/bus/pci")
    async with api_with_node() as k:
        assert await run_once(k.kubeconfig, str(tmp_path)) == 1
        obj = stored(k)
        assert "groups" not in obj["spec"], obj["spec"]  # so nobody reads "this node has no GPUs"
        assert [i["name"] for i in obj["spec"]["interfaces"]] == ["ens1f0", "ens1f1"]
        accelerators = conditions(obj)["AcceleratorsEnumerated"]
        assert (accelerators["status"], accelerators["reason"]) == ("False", "PciBusAbsent")
        # A second failing pass writes no empty list either (a spec patch leaves the key out).
        assert await run_once(k.kubeconfig, str(tmp_path)) == 1
        assert "groups" not in stored(k)["spec"]


async def test_a_pass_that_enumerated_and_found_none_writes_the_empty_lists(tmp_path):
    two_nic_host(tmp_path)
    os.symlink("../../devices/pci0000:16/0000:99:00.0/net/ens9", tmp_path / "sys/class/net/ens9")
    async with api_with_node() as k:
        assert await run_once(k.kubeconfig, str(tmp_path)) == 1
        assert "interfaces" not in stored(k)["spec"]
        for entry in (tmp_path / "sys/class/net").iterdir():
            entry.unlink()
        assert await run_once(k.kubeconfig, str(tmp_path)) == 0
        assert stored(k)["spec"]["interfaces"] == []  # read, and none: a fact, written


# --- what kubectl shows: the Ready roll-up and the agent's printer columns --------------------------------


async def _kubectl(kubeconfig: str, cache: Path, *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        "kubectl", "--kubeconfig", kubeconfig, "--cache-dir", str(cache), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed here")
async def test_kubectl_wait_for_ready_and_the_columns_for_failed_links_and_unread_parts(tmp_path):
    root, cache = tmp_path / "root", tmp_path / "cache"
    b = two_nic_host(root)
    # One PF with two VFs configured: served as its two VFs, never whole (what kubelet gets).
    b.bridge("0000:18:01.0", host_bridge="pci0000:18")
    b.nic("0000:19:00.0", "ens2f0", parent="0000:18:01.0", numa=0, rdma="mlx5_2", verbs=2)
    b.sriov("0000:19:00.0", vfs=2, rdma_prefix="mlx5_", first_rdma=3, first_verbs=3)
    set_port(b, "0000:17:00.1", "mlx5_1", Port(state="DOWN", phys_state="Disabled"))
    os.symlink("../../devices/pci0000:16/0000:99:00.0/net/ens9", root / "sys/class/net/ens9")
    async with api_with_node() as k:
        assert await run_once(k.kubeconfig, str(root)) == 1
        ready = conditions(stored(k))["Ready"]
        assert (ready["status"], ready["reason"]) == ("False", "NotRead")
        assert "InterfacesEnumerated" in ready["message"]
        rc, out = await _kubectl(
            k.kubeconfig, cache, "wait", f"devices/{NODE}", "--for=condition=Ready", "--timeout=2s"
        )
        assert rc != 0, out
        rc, out = await _kubectl(k.kubeconfig, cache, "get", "devices")
        assert rc == 0, out
        header, row = out.splitlines()
        assert header.split() == ["NAME", "RDMA", "DISTANCE", "FABRIC", "FAILED", "UNREAD", "AGE"]
        # Nothing was read yet, so nothing is served; the unread part is named.
        assert row.split()[1] == "0" and row.split()[2:4] == ["0", "interfaces"], row

        (root / "sys/class/net/ens9").unlink()
        assert await run_once(k.kubeconfig, str(root)) == 0
        rc, out = await _kubectl(
            k.kubeconfig, cache, "wait", f"devices/{NODE}", "--for=condition=Ready", "--timeout=20s"
        )
        assert rc == 0, out
        ready = conditions(stored(k))["Ready"]
        assert (ready["status"], ready["reason"]) == ("True", "Published")
        rc, out = await _kubectl(k.kubeconfig, cache, "get", "devices", "-o", "wide")
        header, row = out.splitlines()
        assert header.split()[:2] == ["NAME", "RDMA"] and "USABLE" in header.split()
        # Served: ens1f0, ens1f1 (down: Unhealthy, still served) and the two VFs; not the PF with VFs.
        assert row.split()[1] == "4", row
        status = stored(k)["status"]
        assert (status["rdmaServed"], status["failedLinks"], status["notRead"]) == (4, 1, "")


@pytest.mark.parametrize("serve", ["deviceplugin", "dra"])
async def test_an_overlapping_rdma_selection_stops_the_agent_at_start(tmp_path, serve, caplog):
    two_nic_host(tmp_path)
    selectors = tmp_path / "sel.yaml"
    selectors.write_text("exclusive:\n  - vendors: ['15b3']\nshared:\n  - ifNames: [ens1f1]\n")
    dra = tempfile.mkdtemp(prefix="nfsel", dir="/tmp")
    try:
        async with api_with_node() as k:
            extra = ["--rdma-selectors", str(selectors), "--serve", serve, "--plugin-dir", f"{dra}/dp"]
            extra += [
                "--dra-plugin-dir",
                f"{dra}/p",
                "--dra-registry-dir",
                f"{dra}/r",
                "--dra-cdi-dir",
                f"{dra}/c",
            ]
            assert await run_once(k.kubeconfig, str(tmp_path), *extra) == 2
            assert stored(k) is None, "nothing is published by an agent that refused to start"
        assert any("exclusive[0] and shared[0] overlap" in getattr(r, "error", "") for r in caplog.records)
    finally:
        shutil.rmtree(dra, ignore_errors=True)
