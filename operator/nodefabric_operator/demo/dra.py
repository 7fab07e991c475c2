"""The demo's DRA part: hgx-0's agent feeds the DRA driver; its ResourceSlices are shown, then a claim for
GPU 0 and the NIC under the same PCIe root (what the scheduler allocates for a `matchAttribute:
resource.kubernetes.io/pcieRoot` constraint) is prepared through the test kubelet, with its CDI spec."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import kmock

from nodefabric_devicemanager import nodeclient
from nodefabric_devicemanager.agent import wiring
from nodefabric_devicemanager.agent.core import Agent
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_deviceplugin.dra.claims import ClaimRef
from nodefabric_deviceplugin.dra.config import DriverConfig
from nodefabric_deviceplugin.testing.drakubelet import DraClient, DraKubelet
from nodefabric_operator.demo import temporary
from nodefabric_operator.demo.kubeapi import RunningAPI

SLICES = "resource.k8s.io/v1/resourceslices"
CLAIMS = "resource.k8s.io/v1/resourceclaims"
GPU_DRIVER = "gpu.nvidia.com"


def _published(k: RunningAPI) -> list[dict[str, Any]]:
    return [o.raw for key, o in k.api.objects.items() if key[0] == kmock.resource(SLICES) and not o.deleted]


def _table(obj: dict[str, Any]) -> list[str]:
    pool = obj["spec"]["pool"]
    lines = [
        f"\n  ResourceSlice {obj['metadata']['name']}: pool {pool['name']},"
        f" generation {pool['generation']}, {len(obj['spec']['devices'])} devices\n"
    ]
    rows = [["DEVICE", "RDMA", "PCIE-ROOT", "NUMA", "FUNCTION", "GPU-DISTANCE", "LINK"]]
    for device in obj["spec"]["devices"]:
        a = {name.rpartition("/")[2]: next(iter(v.values())) for name, v in device["attributes"].items()}
        names = ("rdmaDevice", "pcieRoot", "numaNode", "functionType", "acceleratorDistance", "linkState")
        rows.append([device["name"], *(str(a.get(n, "-")) for n in names)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += [
        "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n" for r in rows
    ]
    return lines


async def _prepare(
    k: RunningAPI, plugin: DraClient, config: DriverConfig, gpu_root: str, obj: dict[str, Any]
) -> list[str]:
    nic = next(
        d for d in obj["spec"]["devices"]
        if d["attributes"].get("resource.kubernetes.io/pcieRoot") == {"string": gpu_root}
    )  # fmt: skip
    results = [
        {"request": "gpu", "driver": GPU_DRIVER, "pool": config.pool, "device": "gpu-0"},
        {"request": "nic", "driver": config.driver, "pool": config.pool, "device": nic["name"]},
    ]
    meta = {"name": "train-0-gpu-nic", "namespace": "ml"}
    claim = k.api.put_object(
        CLAIMS, {"metadata": meta, "status": {"allocation": {"devices": {"results": results}}}}
    )
    ref = ClaimRef("ml", claim["metadata"]["uid"], meta["name"])
    lines = [
        f"\n  claim ml/{ref.name} is allocated gpu-0 ({GPU_DRIVER}, pcieRoot {gpu_root}) and {nic['name']}"
        f" ({config.driver}, the NIC under the same PCIe root)\n"
    ]
    answer = (await plugin.prepare(ref))[ref.uid]
    lines += [
        f"  NodePrepareResources: {d.device_name} -> {', '.join(d.cdi_device_ids)}\n" for d in answer.devices
    ]
    if answer.error:
        lines.append(f"  NodePrepareResources failed: {answer.error}\n")
        return lines
    (name,) = os.listdir(config.cdi_dir)
    lines.append(f"  CDI spec {name}:\n")
    lines += [f"    {line}\n" for line in (Path(config.cdi_dir) / name).read_text().splitlines()]
    again = (await plugin.prepare(ref))[ref.uid]
    specs = len(os.listdir(config.cdi_dir))
    lines.append(
        f"  prepared again (as after a kubelet restart): same answer {again == answer}, spec files {specs}\n"
    )
    error = (await plugin.unprepare(ref))[ref.uid] or "ok"
    lines.append(f"  NodeUnprepareResources: {error}; spec files left: {len(os.listdir(config.cdi_dir))}\n")
    return lines


async def dra_driver(agent: Agent, root: Path, k: RunningAPI) -> str:
    with temporary.directory("dp-dra-", "/tmp") as base:  # unix socket paths are short
        config = DriverConfig(
            node_name=agent.config.node,
            plugin_dir=f"{base}/plugins",
            registry_dir=f"{base}/registry",
            cdi_dir=f"{base}/cdi",
        )
        driver = wiring.dra_driver(agent.subscribe, HostRoot.at(root), config, nodeclient.load(k.kubeconfig))
        kubelet = DraKubelet(config.registry_dir)
        stop = asyncio.Event()
        task = asyncio.create_task(driver.run(stop))
        try:
            plugin = await kubelet.wait_registered(config.driver, timeout=30)
            lines = [
                f"  registered with kubelet's plugin watcher as {config.driver} ({plugin.version.service})\n"
            ]
            deadline = time.monotonic() + 30
            while not _published(k):
                if time.monotonic() > deadline:
                    raise TimeoutError("gave up waiting for the driver to publish its ResourceSlices")
                await asyncio.sleep(0.1)
            (obj,) = _published(k)
            lines += _table(obj)
            gpu_root = agent.record.groups[0].accelerators[0].topology.pci_host_bridge if agent.record else ""
            lines += await _prepare(k, plugin, config, gpu_root, obj)
        finally:
            await kubelet.stop()
            stop.set()
            await asyncio.wait_for(task, 15)
        return "".join(lines)
