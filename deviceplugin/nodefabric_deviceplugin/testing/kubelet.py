"""A kubelet stand-in for tests and the demo: the device-manager half of kubelet, over real unix sockets.

    kubelet = KubeletEmulator(plugin_dir)
    await kubelet.start()                                    # serves Registration on kubelet.sock
    ...                                                      # the plugin registers
    await kubelet.wait_registered("device.gpustack.ai/rdma")
    devices = await kubelet.wait_devices("device.gpustack.ai/rdma", lambda ds: len(ds) == 2)
    plugin = kubelet.plugin("device.gpustack.ai/rdma")       # a client on the plugin's socket
    response = await plugin.allocate(["0000:19:00.0"])
    await kubelet.restart()                                  # delete every socket, recreate kubelet.sock
    kubelet.hold_registrations = asyncio.Event()             # Register waits until it is set
    await kubelet.stop()

Like kubelet it validates a registration (API version, resource name, socket inside the directory), dials
the plugin back inside Register and calls GetDevicePluginOptions (so a plugin that registers before it
serves fails here as it would on a node), then keeps one ListAndWatch stream per resource open and
remembers the latest list: capacity counts every device, allocatable the Healthy ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc

from nodefabric_deviceplugin import rpc
from nodefabric_deviceplugin.api import deviceplugin_pb2 as pb

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
API_VERSION = "v1beta1"
_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")

DeviceList = list[pb.Device]


class PluginClient:
    """kubelet's client of one plugin socket."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.channel = grpc.aio.insecure_channel(f"unix://{socket_path}")
        self.stub = rpc.device_plugin_stub(self.channel)

    async def options(self, timeout: float = 5.0) -> pb.DevicePluginOptions:
        return await self.stub.GetDevicePluginOptions(pb.Empty(), timeout=timeout)

    def list_and_watch(self) -> grpc.aio.UnaryStreamCall[pb.Empty, pb.ListAndWatchResponse]:
        return self.stub.ListAndWatch(pb.Empty())

    async def allocate(self, *containers: Sequence[str], timeout: float = 5.0) -> pb.AllocateResponse:
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=list(ids)) for ids in containers]
        )
        return await self.stub.Allocate(request, timeout=timeout)

    async def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int, timeout: float = 5.0
    ) -> list[str]:
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must_include),
                    allocation_size=size,
                )
            ]
        )
        response = await self.stub.GetPreferredAllocation(request, timeout=timeout)
        return list(response.container_responses[0].deviceIDs)

    async def close(self) -> None:
        await self.channel.close(None)


@dataclass
class ResourceState:
    """What kubelet knows of one resource: its registrations and the latest device list."""

    registrations: list[pb.RegisterRequest] = field(default_factory=list)
    registered_at: list[float] = field(default_factory=list)  # time.time() of each accepted registration
    devices: DeviceList = field(default_factory=list)
    lists_received: int = 0
    stream_ended: bool = False  # kubelet would now mark every device Unhealthy

    @property
    def capacity(self) -> int:
        return len(self.devices)

    @property
    def allocatable(self) -> int:
        return sum(1 for d in self.devices if d.health == "Healthy")


class _Registration(rpc.RegistrationServicer):
    def __init__(self, kubelet: KubeletEmulator) -> None:
        self.kubelet = kubelet

    async def Register(
        self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext[pb.RegisterRequest, pb.Empty]
    ) -> pb.Empty:
        problem = await self.kubelet.admit(request)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        return pb.Empty()


class KubeletEmulator:
    def __init__(self, plugin_dir: str | os.PathLike[str]) -> None:
        self.plugin_dir = os.fspath(plugin_dir)
        self.socket_path = os.path.join(self.plugin_dir, KUBELET_SOCKET)
        self.resources: dict[str, ResourceState] = {}
        self.refuse: dict[str, str] = {}  # resource -> reason: answer Register with this error
        # A slow kubelet: while this is an Event not set, each Register waits for it before its checks.
        self.hold_registrations: asyncio.Event | None = None
        self.registrations_held = 0  # Register calls waiting on hold_registrations now
        self.generation = 0  # grows on every start; restart() makes a new one
        self._server: grpc.aio.Server | None = None
        self._streams: dict[str, asyncio.Task[None]] = {}
        self._clients: dict[str, PluginClient] = {}
        self._changed = asyncio.Condition()

    # -- lifecycle -------------------------------------------------------------------------------------

    async def start(self) -> None:
        os.makedirs(self.plugin_dir, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        server = grpc.aio.server()
        rpc.add_registration_servicer(_Registration(self), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server
        self.generation += 1

    async def stop(self) -> None:
        for task in self._streams.values():
            task.cancel()
        for task in self._streams.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._streams.clear()
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace=None)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    async def restart(self) -> None:
        """What kubelet does on restart: forget every plugin, delete every socket, listen anew."""
        await self.stop()
        for state in self.resources.values():
            state.devices = []
            state.lists_received = 0
        for name in os.listdir(self.plugin_dir):
            path = os.path.join(self.plugin_dir, name)
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    os.unlink(path)
        with open(os.path.join(self.plugin_dir, "DEPRECATION"), "w") as f:
            f.write("This directory is deprecated and will be removed in a future release.\n")
        await self.start()

    # -- registration ----------------------------------------------------------------------------------

    async def admit(self, request: pb.RegisterRequest) -> str:
        """Validate a registration like kubelet; "" when accepted. Starts the resource's ListAndWatch."""
        await self._held()
        if request.version != API_VERSION:
            return f"unsupported API version {request.version!r}"
        if not _RESOURCE.match(request.resource_name):
            return f"invalid resource name {request.resource_name!r}"
        if not request.endpoint or "/" in request.endpoint:
            return f"invalid endpoint {request.endpoint!r}"
        if request.resource_name in self.refuse:
            return self.refuse[request.resource_name]
        client = PluginClient(os.path.join(self.plugin_dir, request.endpoint))
        try:
            # kubelet dials back inside Register: a plugin must already be serving.
            await client.options(timeout=2.0)
        except grpc.aio.AioRpcError as exc:
            await client.close()
            return f"cannot reach the plugin at {request.endpoint}: {exc.code().name} {exc.details()}"
        old = self._clients.pop(request.resource_name, None)
        task = self._streams.pop(request.resource_name, None)
        if task is not None:
            task.cancel()
        if old is not None:
            await old.close()
        self._clients[request.resource_name] = client
        state = self.resources.setdefault(request.resource_name, ResourceState())
        state.registrations.append(request)
        state.registered_at.append(time.time())
        state.stream_ended = False
        self._streams[request.resource_name] = asyncio.create_task(self._watch(request.resource_name, client))
        async with self._changed:
            self._changed.notify_all()
        return ""

    async def _held(self) -> None:
        hold = self.hold_registrations
        if hold is None or hold.is_set():
            return
        self.registrations_held += 1
        try:
            async with self._changed:
                self._changed.notify_all()
            await hold.wait()
        finally:
            self.registrations_held -= 1

    async def _watch(self, resource: str, client: PluginClient) -> None:
        state = self.resources[resource]
        try:
            async for message in client.list_and_watch():
                state.devices = list(message.devices)
                state.lists_received += 1
                async with self._changed:
                    self._changed.notify_all()
        except grpc.aio.AioRpcError as exc:
            log.info("list and watch ended", extra={"resource": resource, "code": exc.code().name})
        state.stream_ended = True
        async with self._changed:
            self._changed.notify_all()

    # -- observations ----------------------------------------------------------------------------------

    def plugin(self, resource: str) -> PluginClient:
        """The client kubelet holds for a registered resource."""
        return self._clients[resource]

    def registrations(self, resource: str) -> int:
        state = self.resources.get(resource)
        return len(state.registrations) if state else 0

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(predicate)

    async def wait_registered(
        self, resource: str, count: int = 1, timeout: float = 5.0
    ) -> pb.RegisterRequest:
        await self.wait_for(lambda: self.registrations(resource) >= count, timeout)
        return self.resources[resource].registrations[-1]

    async def wait_devices(
        self, resource: str, predicate: Callable[[DeviceList], bool] = lambda _: True, timeout: float = 5.0
    ) -> DeviceList:
        """The resource's device list once a received list satisfies `predicate`."""

        def ready() -> bool:
            state = self.resources.get(resource)
            return state is not None and state.lists_received > 0 and predicate(state.devices)

        await self.wait_for(ready, timeout)
        return self.resources[resource].devices
