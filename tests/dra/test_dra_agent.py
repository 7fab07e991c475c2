"""`nodefabric agent --serve dra|both`: the DRA driver in the agent's process, fed by its passes, beside
the device plugin on distinct sockets and never offering an endpoint the device plugin offers."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from dra_helpers import DRIVER, NODE, hgx, live_slices, put_claim, put_node, result

from nodefabric_devicemanager import crd, nodeclient
from nodefabric_devicemanager.agent.metrics import AgentMetrics
from nodefabric_deviceplugin.dra.claims import ClaimRef
from nodefabric_deviceplugin.testing.drakubelet import DraKubelet
from nodefabric_deviceplugin.testing.kubelet import KubeletEmulator
from nodefabric_operator.demo.kubeapi import running_api

NODEFABRIC = (sys.executable, "-m", "nodefabric_operator.console")
VFS = {"0000:e0:00.1", "0000:e0:00.2", "0000:e0:00.3", "0000:e0:00.4"}


def _readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


async def _until_ready(port: int, predicate: Callable[[int, str], bool], what: str) -> tuple[int, str]:
    answers = [await asyncio.to_thread(_readyz, port)]
    try:
        async with asyncio.timeout(60):
            while not predicate(*answers[-1]):
                await asyncio.sleep(0.1)
                answers.append(await asyncio.to_thread(_readyz, port))
    except TimeoutError:
        raise AssertionError(f"no {what} in 60 s; the last answers: {answers[-3:]}") from None
    return answers[-1]


async def test_both_splits_the_endpoints_between_dra_and_the_device_plugin(tmp_path: Path) -> None:
    hgx(tmp_path / "h")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        health = s.getsockname()[1]
    base = tempfile.mkdtemp(prefix="nfag", dir="/tmp")
    dp_dir, registry, plugins, cdi_dir = (f"{base}/{d}" for d in ("dp", "reg", "plugins", "cdi"))
    async with running_api([crd.devices_crd()], directory=str(tmp_path)) as k:
        k.api.put_object("v1/nodes", {"metadata": {"name": NODE}})
        kubelet, dra_kubelet = KubeletEmulator(dp_dir), DraKubelet(registry)
        await kubelet.start()
        proc = await asyncio.create_subprocess_exec(
            *NODEFABRIC, "agent", "--node-name", NODE, "--root", str(tmp_path / "h"),
            "--kubeconfig", k.kubeconfig, "--interval", "3600", "--no-uevents",
            "--metrics-port", "0", "--health-port", str(health), "--bind-address", "127.0.0.1",
            "--plugin-dir", dp_dir, "--serve", "both", "--dra-plugin-dir", plugins,
            "--dra-registry-dir", registry, "--dra-cdi-dir", cdi_dir,
            stderr=(tmp_path / "stderr").open("w"),
        )  # fmt: skip
        try:
            exclusive = await kubelet.wait_devices("device.gpustack.ai/rdma", timeout=60)
            partitioned = await kubelet.wait_devices(
                "device.gpustack.ai/rdma.partitioned", lambda ds: len(ds) == 4, timeout=60
            )
            assert exclusive == [] and {d.ID for d in partitioned} == VFS
            # The device plugin is registered; the driver is not until kubelet's plugin watcher finds it.
            status, why = await _until_ready(
                health, lambda status, why: why.startswith("DRA driver"), "the DRA driver's readiness"
            )
            assert (status, why) == (503, "DRA driver: not registered with kubelet (waiting for kubelet's"
                                     " plugin watcher)\n")  # fmt: skip
            plugin = await dra_kubelet.wait_registered(DRIVER, timeout=60)
            await _until_ready(health, lambda status, _: status == 200, "ready")
            async with asyncio.timeout(30):
                while not live_slices(k):
                    await asyncio.sleep(0.1)
            dra = {
                d["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
                for d in live_slices(k)[0]["spec"]["devices"]
            }
            assert len(dra) == 7 and not dra & VFS  # the seven whole NICs, none of NIC 7's VFs
            whole = put_claim(k, "whole", [result("pci-0000-1c-00-0")])
            vf = put_claim(k, "vf", [result("pci-0000-e0-00-1")])
            answer = await plugin.prepare(
                *(ClaimRef("ml", c["metadata"]["uid"], c["metadata"]["name"]) for c in (whole, vf))
            )
            assert answer[whole["metadata"]["uid"]].error == ""
            assert "no device pci-0000-e0-00-1" in answer[vf["metadata"]["uid"]].error
            # Distinct sockets, each where its kubelet API expects it.
            assert os.path.exists(f"{plugins}/{DRIVER}/dra.sock") and os.path.exists(
                f"{registry}/{DRIVER}-reg.sock"
            )
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 30) == 0
            assert os.listdir(registry) == []
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await dra_kubelet.stop()
            await kubelet.stop()
    assert "Traceback" not in (tmp_path / "stderr").read_text()


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--serve", "both", "--no-device-plugin"], "contradict each other"),
        (["--serve", "dra", "--dra-cdi-dir", "relative"], "--cdi-dir must be an absolute path"),
        (["--serve", "dra", "--domain", "x" * 60 + ".io"], "at most 63 characters"),
        (
            ["--serve", "dra", "--dra-registry-dir", "{file}"],
            "registration directory {file} exists and is not",
        ),
        (
            ["--serve", "both", "--dra-cdi-dir", "{file}/cdi"],
            "the CDI directory {file}/cdi cannot be created",
        ),
        (["--serve", "dra", "--dra-plugin-dir", "{file}"], f"socket directory {{file}}/{DRIVER} cannot be"),
    ],
)
def test_bad_dra_settings_are_a_usage_error(console, tmp_path: Path, args: list[str], why: str) -> None:
    file = tmp_path / "a-file"  # where a directory should be
    file.write_text("")
    base = tempfile.mkdtemp(prefix="nfag", dir="/tmp")
    dirs = ["--plugin-dir", f"{base}/dp", "--dra-plugin-dir", f"{base}/p", "--dra-registry-dir", f"{base}/r",
            "--dra-cdi-dir", f"{base}/c"]  # fmt: skip
    done = console(
        "agent", "--node-name", NODE, "--root", str(tmp_path), "--kubeconfig", "/none", *dirs,
        *(a.format(file=file) for a in args),
    )  # fmt: skip
    assert done.returncode == 2
    assert why.format(file=file) in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


async def test_the_drivers_requests_count_in_the_agents_api_metrics(tmp_path: Path) -> None:
    async with running_api([crd.devices_crd()], directory=str(tmp_path)) as k:
        put_node(k)
        metrics = AgentMetrics()
        agent_api = nodeclient.load(k.kubeconfig)
        dra_api = nodeclient.load(k.kubeconfig, user_agent="nodefabric-agent-dra")
        metrics.count_api(agent_api)
        metrics.count_api(dra_api)
        for client in (agent_api, dra_api, dra_api):
            await asyncio.to_thread(client.request, "GET", f"/api/v1/nodes/{NODE}")
        sample = metrics.registry.get_sample_value
        assert sample("nodefabric_agent_api_requests_total") == 3 == k.count("GET", "v1/nodes")
        assert (
            sample("nodefabric_agent_api_response_bytes_total")
            == sum(c.bytes_received for c in (agent_api, dra_api))
            > 0
        )
