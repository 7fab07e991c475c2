"""Shared pieces of the agent tests: a fixture host, the API emulator with a Node, a real agent."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kubernetes

from nodefabric_devicemanager import crd, nodeclient
from nodefabric_devicemanager.agent.core import Agent, AgentConfig
from nodefabric_devicemanager.agent.kube import DevicesClient
from nodefabric_devicemanager.nodeclient import Backoff
from nodefabric_devicemanager.testing.sysfs import (
    PHYS_STATE_CODES,
    STATE_CODES,
    Port,
    SysfsBuilder,
    port_value,
)
from nodefabric_operator.demo.kubeapi import RunningAPI, running_api

NODE = "gpu-node-1"
DEVICES = "worker.gpustack.ai/v1alpha1/devices"
G, V, P = "worker.gpustack.ai", "v1alpha1", "devices"


def two_nic_host(root: Path) -> SysfsBuilder:
    """Two ConnectX ports with RDMA devices behind one root port, both links up."""
    b = SysfsBuilder(root)
    b.bridge("0000:16:01.0", host_bridge="pci0000:16")
    b.nic("0000:17:00.0", "ens1f0", parent="0000:16:01.0", numa=0, rdma="mlx5_0", verbs=0)
    b.nic("0000:17:00.1", "ens1f1", parent="0000:16:01.0", numa=0, rdma="mlx5_1", verbs=1)
    b.rdma_cm()
    return b


def set_port(b: SysfsBuilder, bus_id: str, dev: str, port: Port) -> None:
    """Change an RDMA port's state in place, as the kernel does when a link drops or comes back."""
    ports = b.functions[bus_id] / "infiniband" / dev / "ports" / "1"
    (ports / "state").write_text(port_value(port.state, STATE_CODES))
    (ports / "phys_state").write_text(port_value(port.phys_state, PHYS_STATE_CODES))


def break_interface_enumeration(root: Path) -> None:
    """Make /sys/class/net unlistable (a file where the directory belongs): fails even as root."""
    net = root / "sys/class/net"
    net.rename(root / "sys/class/net.saved")
    net.write_text("")


def restore_interface_enumeration(root: Path) -> None:
    (root / "sys/class/net").unlink()
    (root / "sys/class/net.saved").rename(root / "sys/class/net")


@contextlib.asynccontextmanager
async def api_with_node(node: str = NODE) -> AsyncIterator[RunningAPI]:
    async with running_api([crd.devices_crd()]) as k:
        k.api.put_object("v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
        yield k


def make_agent(k: RunningAPI, root: Path, node: str = NODE, **config: Any) -> Agent:
    config.setdefault("backoff", Backoff(base=0.01, cap=0.05))
    return Agent(
        AgentConfig(node=node, root=str(root), **config), DevicesClient(nodeclient.load(k.kubeconfig))
    )


def writes(k: RunningAPI) -> list[Any]:
    """Every write the API received for Devices objects (create, and spec or status patches)."""
    return k.requests("POST", DEVICES) + k.requests("PATCH", DEVICES) + k.requests("PUT", DEVICES)


def watched(k: RunningAPI) -> bool:
    """The API has received the agent's watch of its record. The agent counts a connect when it sends
    the request, so a request budget taken before this holds would race the watch's own GET."""
    return any(r.params.get("watch") == "true" for r in k.requests("GET", DEVICES))


def stored(k: RunningAPI, node: str = NODE) -> dict[str, Any] | None:
    return k.api.stored(DEVICES, node)


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in obj.get("status", {}).get("conditions", [])}


def interface(obj: dict[str, Any], name: str) -> dict[str, Any]:
    return next(i for i in obj["spec"]["interfaces"] if i["name"] == name)


def _client(k: RunningAPI) -> kubernetes.client.ApiClient:
    cfg = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=k.kubeconfig, client_configuration=cfg)
    return kubernetes.client.ApiClient(cfg)


async def operator_writes_status(k: RunningAPI, conds: list[dict[str, Any]], labels: dict[str, str]) -> None:
    """Another writer (the operator) patches status as it does: its own fields, conditions merged."""
    body = {"status": {"conditions": conds, "labels": labels}}
    custom = kubernetes.client.CustomObjectsApi(_client(k))
    await asyncio.to_thread(custom.patch_cluster_custom_object_status, G, V, P, NODE, body)


async def hand_edits_spec(k: RunningAPI, spec: dict[str, Any]) -> None:
    """Someone edits the record's spec through the API (`kubectl edit`): a merge patch."""
    custom = kubernetes.client.CustomObjectsApi(_client(k))
    await asyncio.to_thread(custom.patch_cluster_custom_object, G, V, P, NODE, {"spec": spec})


async def delete_devices(k: RunningAPI, node: str = NODE) -> None:
    """Someone deletes the record (`kubectl delete devices NODE`)."""
    custom = kubernetes.client.CustomObjectsApi(_client(k))
    await asyncio.to_thread(custom.delete_cluster_custom_object, G, V, P, node)


async def delete_node(k: RunningAPI, node: str = NODE) -> None:
    await asyncio.to_thread(kubernetes.client.CoreV1Api(_client(k)).delete_node, node)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nodefabric_bin() -> str:
    here = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "nodefabric"
    found = str(here) if here.exists() else shutil.which("nodefabric")
    assert found, "the nodefabric console script is not installed"
    return found


async def until(predicate: Any, timeout: float = 20.0, what: str = "") -> None:
    """Wait for exactly the condition a test asserts, with headroom for a loaded machine."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def uevents_writable() -> bool:
    return os.access("/sys/class/net/lo/uevent", os.W_OK)
