"""Helpers of the DRA tests: fixture hosts and their records, ResourceClaims, a running driver."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kmock
import pytest

from nodefabric_devicemanager import inventory, nodeclient
from nodefabric_devicemanager.accelerators import Libraries
from nodefabric_devicemanager.accelerators.ascend import NoAscend
from nodefabric_devicemanager.accelerators.nvidia import NoNvidia, Nvml
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_devicemanager.testing.accelerators import nvswitch_node
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder
from nodefabric_deviceplugin.dra import devices, hops
from nodefabric_deviceplugin.dra.checkpoint import Checkpoint
from nodefabric_deviceplugin.dra.claims import ClaimRef
from nodefabric_deviceplugin.dra.config import DriverConfig
from nodefabric_deviceplugin.dra.driver import DraDriver
from nodefabric_deviceplugin.dra.kube import DraApi
from nodefabric_deviceplugin.dra.prepare import Preparer
from nodefabric_deviceplugin.source import RecordSource
from nodefabric_deviceplugin.testing.drakubelet import DraKubelet
from nodefabric_operator.demo.kubeapi import RunningAPI

NODE = "hgx-0"
DRIVER = "rdma.gpustack.ai"
SLICES = "resource.k8s.io/v1/resourceslices"
CLAIMS = "resource.k8s.io/v1/resourceclaims"
SPLIT_PF = "0000:e0:00.0"  # the HGX NIC split into VFs
NIC0 = "pci-0000-1c-00-0"  # mlx5_0, beside GPU 0
NIC0_BUS = "0000:1c:00.0"
NIC1 = "pci-0000-44-00-0"  # mlx5_1
SYNC_THREAD = "read the host for the ResourceSlices"  # the slice publisher's own thread
POOL_THREAD = "the DRA pool"  # the pool's builds' thread


def hgx(root: Path, *, vfs: int = 4) -> tuple[SysfsBuilder, Libraries]:
    """An 8-GPU NVSwitch board, a ConnectX-7 beside each GPU under its PCIe switch; NIC 7 split into VFs."""
    b = SysfsBuilder(root)
    nvml = nvswitch_node(b, clique_id=1)
    b.sriov(SPLIT_PF, vfs=vfs, numa=1, rdma_prefix="mlx5_", first_rdma=8, first_verbs=8)
    b.rdma_cm()
    return b, Libraries(nvidia=Nvml(nvml), ascend=NoAscend())


NO_LIBRARIES = Libraries(nvidia=NoNvidia(), ascend=NoAscend())


def read(b: SysfsBuilder, libraries: Libraries = NO_LIBRARIES) -> DevicesSpec:
    """The record the inventory reads from a fixture host."""
    reading = inventory.read(b.host, libraries=libraries)
    assert reading.interfaces is not None
    return reading.spec()


def without(spec: DevicesSpec, *buses: str) -> DevicesSpec:
    """The record with the given NICs gone (unplugged, or not probed yet)."""
    return spec.model_copy(update={"interfaces": [i for i in spec.interfaces if i.pci_bus_id not in buses]})


def gpu_pcie_roots(spec: DevicesSpec) -> dict[str, str]:
    """GPU bus id -> its host bridge, as another driver (the GPU vendor's) would publish pcieRoot."""
    return {a.id: a.topology.pci_host_bridge for g in spec.groups for a in g.accelerators}


def put_node(k: RunningAPI, name: str = NODE) -> dict[str, Any]:
    return k.api.put_object("v1/nodes", {"metadata": {"name": name}})


def result(device: str, *, request: str = "nic", driver: str = DRIVER, pool: str = NODE) -> dict[str, Any]:
    return {"request": request, "driver": driver, "pool": pool, "device": device}


def put_claim(
    k: RunningAPI, name: str, results: list[dict[str, Any]] | None, *, namespace: str = "ml", uid: str = ""
) -> dict[str, Any]:
    """A ResourceClaim as the scheduler leaves it: allocated (`results`), or not (None)."""
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4())},
        "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": DRIVER}}]}},
    }
    if results is not None:
        obj["status"] = {
            "allocation": {
                "devices": {"results": results},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
                    ]
                },
            }
        }
    return k.api.put_object(CLAIMS, obj)


def live_slices(k: RunningAPI) -> list[dict[str, Any]]:
    return sorted(
        (o.raw for key, o in k.api.objects.items() if key[0] == kmock.resource(SLICES) and not o.deleted),
        key=lambda o: o["metadata"]["name"],
    )


def slice_writes(k: RunningAPI) -> int:
    return sum(k.count(m, SLICES) for m in ("POST", "PATCH", "PUT", "DELETE"))


def client(k: RunningAPI) -> nodeclient.Api:
    return nodeclient.load(k.kubeconfig)


@dataclass
class Dirs:
    plugin: str
    registry: str
    cdi: str

    def config(self, node: str = NODE, **kw: Any) -> DriverConfig:
        return DriverConfig(
            node_name=node, plugin_dir=self.plugin, registry_dir=self.registry, cdi_dir=self.cdi, **kw
        )


def start_preparer(
    k: RunningAPI, dirs: Dirs, host: HostRoot, source: RecordSource, **options: Any
) -> Preparer:
    """A Preparer on `dirs` as the driver starts one, on what the disk holds, reading claims from the API
    (`options` go to Preparer: verbs)."""
    config = dirs.config()
    return Preparer(
        config, source, host, DraApi(client(k), config), Checkpoint(config.checkpoint_path), **options
    )


@dataclass
class Running:
    driver: DraDriver
    source: RecordSource
    kubelet: DraKubelet
    stop: asyncio.Event
    task: asyncio.Task[None]


async def start_driver(
    k: RunningAPI,
    dirs: Dirs,
    host: HostRoot,
    spec: DevicesSpec | None,
    *,
    kubelet: DraKubelet | None = None,
    resync: float = 60.0,
    config: DriverConfig | None = None,
    **options: Any,
) -> Running:
    """The driver running on this loop; `options` go to DraDriver (polls, inotify)."""
    config = config or dirs.config()
    source = RecordSource(spec)
    driver = DraDriver(config, source, host, DraApi(client(k), config), resync=resync, **options)
    stop = asyncio.Event()
    task = asyncio.create_task(driver.run(stop))
    return Running(driver, source, kubelet or DraKubelet(dirs.registry), stop, task)


async def shutdown(r: Running) -> None:
    """Stops the driver; again on a stopped one, it only says how its run ended."""
    await r.kubelet.stop()
    r.stop.set()
    await asyncio.wait_for(r.task, 15)


@asynccontextmanager
async def driving(
    k: RunningAPI, dirs: Dirs, host: HostRoot, spec: DevicesSpec | None, **options: Any
) -> AsyncIterator[Running]:
    """start_driver for the body, shut down after it however it ends (the body may shut it down first)."""
    r = await start_driver(k, dirs, host, spec, **options)
    try:
        yield r
    finally:
        await shutdown(r)


def a_pool_build() -> bool:
    """Whether this reading of a record is a build of the pool prepare resolves in, wherever it runs (the
    loop included), not the slice publisher's reading on its own thread."""
    return threading.current_thread().name != SYNC_THREAD


class HeldBuild:
    """The pool's build of record `held` waits for `release` once it has `entered`, says in `order`
    whether it was let go, then raises when `fail` is set; `builds` says of each pool build whether it
    was of `held` or of another record."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, held: DevicesSpec) -> None:
        self.entered, self.release, self.fail = threading.Event(), threading.Event(), threading.Event()
        self.builds: list[str] = []
        self.order: list[str] = []
        real = devices._records

        def records(spec: DevicesSpec) -> Any:
            if a_pool_build():
                self.builds.append("held" if spec is held else "other")
                if spec is held:
                    self.entered.set()
                    # A deadlock breaker, not a measure: built on the loop, nothing could let it go.
                    self.order.append("pool built" if self.release.wait(20) else "pool built, never let go")
                    if self.fail.is_set():
                        raise RuntimeError("injected failure after the hold")
            return real(spec)

        monkeypatch.setattr(devices, "_records", records)


@asynccontextmanager
async def held_driving(  # noqa: PLR0917 (a driver's inputs and the record held)
    k: RunningAPI,
    dirs: Dirs,
    host: HostRoot,
    monkeypatch: pytest.MonkeyPatch,
    spec: DevicesSpec,
    held: DevicesSpec,
) -> AsyncIterator[tuple[Running, HeldBuild]]:
    """A driver started with record `spec` whose pool build of record `held` is held (HeldBuild); the
    build is let go before the driver stops, however the body ends."""
    hold = HeldBuild(monkeypatch, held)
    r = await start_driver(k, dirs, host, spec)
    try:
        yield r, hold
    finally:
        hold.release.set()
        await shutdown(r)


HgxDriver = Callable[..., AbstractAsyncContextManager[Running]]  # conftest's hgx_driver
HeldDriver = Callable[[DevicesSpec, DevicesSpec], AbstractAsyncContextManager[tuple[Running, HeldBuild]]]


class FailingBuilds:
    """Every pool build raises, or only the first `times` of them; `failed` counts those that did."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, times: int | None = None) -> None:
        self.failed = 0
        real = devices._records

        def records(spec: DevicesSpec) -> Any:
            if a_pool_build() and (times is None or self.failed < times):
                self.failed += 1
                raise RuntimeError("injected failure")
            return real(spec)

        monkeypatch.setattr(devices, "_records", records)


async def watching(k: RunningAPI, r: Running) -> tuple[str, dict[str, Any]]:
    """Until the driver has synced its slices once and watches them; the name of its first slice and the
    slice as stored."""
    publisher = r.driver.publisher
    while publisher.syncs < 1 or publisher.watch.connects < 1 or k.count("GET", SLICES, "watch") < 1:
        await asyncio.sleep(0.02)
    name = live_slices(k)[0]["metadata"]["name"]
    stored = k.api.stored(SLICES, name)
    assert stored is not None  # listed just now, and only the driver deletes its slices
    return name, stored


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_QUALIFIED = re.compile(
    r"^(([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)/)?[A-Za-z_][A-Za-z0-9_]{0,31}$"
)


def refusals(obj: dict[str, Any]) -> list[str]:
    """What a resource.k8s.io/v1 API server refuses in a ResourceSlice (its validation rules we touch)."""
    out: list[str] = []
    spec = obj["spec"]
    if not spec.get("driver") or len(spec["driver"]) > 63:
        out.append("driver")
    pool = spec["pool"]
    if not pool.get("name") or pool.get("generation", -1) < 0 or pool.get("resourceSliceCount", 0) < 1:
        out.append("pool")
    devices = spec.get("devices", [])
    if len(devices) > 128:
        out.append("more than 128 devices")
    names = [d["name"] for d in devices]
    if len(set(names)) != len(names):
        out.append("duplicate device names")
    for d in devices:
        if not _DNS_LABEL.match(d["name"]):
            out.append(f"device name {d['name']!r}")
        attrs = d.get("attributes", {})
        if len(attrs) > 32:
            out.append(f"{d['name']}: more than 32 attributes")
        for name, value in attrs.items():
            if not _QUALIFIED.match(name):
                out.append(f"{d['name']}: attribute name {name!r}")
            if len(value) != 1 or next(iter(value)) not in ("string", "int", "bool", "version"):
                out.append(f"{d['name']}: attribute {name} value {value!r}")
            if "string" in value and len(value["string"]) > 64:
                out.append(f"{d['name']}: attribute {name} longer than 64")
    return out


def ref(claim: dict[str, Any]) -> ClaimRef:
    """What kubelet names a claim by, from the claim as the API holds it."""
    meta = claim["metadata"]
    return ClaimRef(meta["namespace"], meta["uid"], meta["name"])


def fd_path(fd: int) -> str:
    """The path an open descriptor names ("" when it names nothing any more)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


class HeldWrites:
    """An `os.write` stand-in that holds each write to a descriptor under `directory` until `hold` is
    set (`entered` says one is held), then writes it, or raises `fail` instead (a full disk)."""

    def __init__(self, directory: str, fail: OSError | None = None) -> None:
        self.directory = directory
        self.fail = fail
        self.hold, self.entered = threading.Event(), threading.Event()
        self.real = os.write

    def __call__(self, fd: int, data: Any) -> int:
        if fd_path(fd).startswith(self.directory):
            self.entered.set()
            self.hold.wait(30)
            if self.fail is not None:
                raise self.fail
        return self.real(fd, data)


def thread_name() -> str:
    """The name of the thread running this (a hop's: `dra-hop-N`)."""
    return threading.current_thread().name


async def idle(pool: hops.HopThreads, count: int = 1) -> None:
    """Until `count` hop threads wait for work (a thread counts itself idle just after its job)."""
    for _ in range(1000):
        if pool._idle >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{count} hop threads never went idle: {pool._idle} idle of {pool._threads}")


async def queued(pool: hops.HopThreads, count: int) -> None:
    """Until `count` jobs wait in the backlog."""
    for _ in range(1000):
        if len(pool._backlog) == count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{count} jobs never queued: {len(pool._backlog)}")
