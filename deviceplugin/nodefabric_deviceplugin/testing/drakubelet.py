"""A kubelet stand-in for DRA drivers, for tests and the demo: its plugin watcher and its DRA client, over
real unix sockets.

    kubelet = DraKubelet(registry_dir)                       # speaks v1 and v1beta1, prefers v1
    await kubelet.start()                                    # the plugin watcher, until stop()
    plugin = await kubelet.wait_registered("rdma.gpustack.ai")
    answer = await plugin.prepare(ClaimRef("ns", uid, "claim"))   # {uid: NodePrepareResourceResponse}
    await plugin.unprepare(ClaimRef("ns", uid, "claim"))
    await kubelet.restart()                                  # forget every plugin and watch again
    await kubelet.stop()

Like kubelet's plugin watcher it finds each socket in the registry directory, calls GetInfo, validates the
answer (type DRAPlugin, a driver name, an absolute endpoint that is a socket, a DRAPlugin service version
it speaks), picks the newest version both sides know, and reports the outcome with
NotifyRegistrationStatus. `DraKubelet(dir, services=("v1beta1.DRAPlugin",))` is a kubelet that only
knows v1beta1.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from nodefabric_deviceplugin.dra import rpc
from nodefabric_deviceplugin.dra.api import pluginregistration_pb2 as reg_pb
from nodefabric_deviceplugin.dra.claims import ClaimRef

DRA_PLUGIN = "DRAPlugin"
_DRIVER = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class DraClient:
    """kubelet's client of one driver's DRA socket, in the API version chosen at registration."""

    def __init__(self, endpoint: str, version: rpc.DraVersion) -> None:
        self.endpoint = endpoint
        self.version = version
        self.channel = grpc.aio.insecure_channel(f"unix://{endpoint}")
        self.stub = version.stub(self.channel)

    def _claims(self, claims: Sequence[ClaimRef]) -> list[Any]:
        pb = self.version.pb
        return [pb.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]

    async def prepare(self, *claims: ClaimRef, timeout: float = 45.0) -> dict[str, Any]:
        """uid -> NodePrepareResourceResponse (kubelet's own call timeout is 45 s)."""
        pb = self.version.pb
        request = pb.NodePrepareResourcesRequest(claims=self._claims(claims))
        response = await self.stub.NodePrepareResources(request, timeout=timeout)
        return dict(response.claims)

    async def unprepare(self, *claims: ClaimRef, timeout: float = 45.0) -> dict[str, str]:
        """uid -> error ("" when unprepared)."""
        pb = self.version.pb
        request = pb.NodeUnprepareResourcesRequest(claims=self._claims(claims))
        response = await self.stub.NodeUnprepareResources(request, timeout=timeout)
        return {uid: entry.error for uid, entry in response.claims.items()}

    async def close(self) -> None:
        await self.channel.close(None)


@dataclass
class Registered:
    info: reg_pb.PluginInfo
    socket: str  # the registration socket it was found at
    client: DraClient


@dataclass
class DraKubelet:
    registry_dir: str
    # The DRAPlugin services this kubelet speaks, preferred first (a current kubelet: v1, then v1beta1).
    services: Sequence[str] = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
    plugins: dict[str, Registered] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)  # registration socket -> why
    registrations: int = 0  # successful GetInfo + NotifyRegistrationStatus(true) rounds, restarts included
    watch_interval: float = 0.05
    _seen: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    _watcher: asyncio.Task[None] | None = None

    def validate(self, info: reg_pb.PluginInfo) -> tuple[str, rpc.DraVersion | None]:
        """("", version) when kubelet accepts the plugin; (why, None) otherwise."""
        if info.type != DRA_PLUGIN:
            return f"unsupported plugin type {info.type!r}", None
        if not _DRIVER.match(info.name) or len(info.name) > 63:
            return f"invalid driver name {info.name!r}", None
        if not os.path.isabs(info.endpoint):
            return f"endpoint {info.endpoint!r} is not an absolute path", None
        try:
            if not stat.S_ISSOCK(os.stat(info.endpoint).st_mode):
                return f"endpoint {info.endpoint} is not a socket", None
        except OSError as exc:
            return f"endpoint {info.endpoint}: {exc.strerror}", None
        offered = set(info.supported_versions)
        for service in self.services:
            if service in offered and service in rpc.VERSIONS:
                return "", rpc.VERSIONS[service]
        return f"none of {list(info.supported_versions)} is a DRAPlugin version this kubelet speaks", None

    async def scan(self) -> None:
        """One pass of the plugin watcher: register every socket in the directory not yet seen."""
        try:
            names = sorted(os.listdir(self.registry_dir))
        except FileNotFoundError:
            return
        for name in names:
            path = os.path.join(self.registry_dir, name)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            identity = (st.st_dev, st.st_ino, st.st_ctime_ns)
            if not stat.S_ISSOCK(st.st_mode) or self._seen.get(path) == identity:
                continue
            if await self._register(path):
                self._seen[path] = identity

    async def _register(self, path: str) -> bool:
        async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
            stub = rpc.registration_stub(channel)
            try:
                info = await stub.GetInfo(reg_pb.InfoRequest(), timeout=5.0)
            except grpc.aio.AioRpcError:
                return False  # not serving yet: the watcher tries again on its next pass
            problem, version = self.validate(info)
            await stub.NotifyRegistrationStatus(
                reg_pb.RegistrationStatus(plugin_registered=not problem, error=problem), timeout=5.0
            )
        if problem or version is None:
            self.refused[path] = problem
            return True
        old = self.plugins.pop(info.name, None)
        if old is not None:
            await old.client.close()
        self.plugins[info.name] = Registered(info, path, DraClient(info.endpoint, version))
        self.refused.pop(path, None)
        self.registrations += 1
        return True

    async def start(self) -> None:
        """Watch the registry directory (kubelet uses inotify; a short poll sees the same sockets)."""
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            await self.scan()
            await asyncio.sleep(self.watch_interval)

    async def wait_registered(self, driver: str, *, count: int = 1, timeout: float = 10.0) -> DraClient:
        """Wait until `driver` has registered `count` times in all (restarts included); its client."""
        await self.start()
        async with asyncio.timeout(timeout):
            while driver not in self.plugins or self.registrations < count:
                await asyncio.sleep(0.02)
        return self.plugins[driver].client

    async def wait_refused(self, timeout: float = 10.0) -> str:
        """Wait until some registration was refused; why."""
        await self.start()
        async with asyncio.timeout(timeout):
            while not self.refused:
                await asyncio.sleep(0.02)
        return next(iter(self.refused.values()))

    def plugin(self, driver: str) -> DraClient:
        return self.plugins[driver].client

    async def restart(self) -> None:
        """What kubelet does on restart: forget every plugin, then find the sockets again."""
        await self.stop()
        await self.start()

    async def stop(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        for registered in self.plugins.values():
            with contextlib.suppress(Exception):
                await registered.client.close()
        self.plugins.clear()
        self._seen.clear()
