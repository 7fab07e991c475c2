"""The gRPC side: one DevicePlugin server per family on its own unix socket, registered with kubelet.

`DevicePluginManager.run()` serves first and registers second (kubelet dials the plugin back inside
Register), then watches the device-plugin directory: when kubelet restarts it deletes every socket there
and recreates kubelet.sock, so a changed kubelet.sock or a vanished socket of ours means serve again and
re-register. A short poll does this within a second without an inotify dependency.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_deviceplugin import metrics, rpc, wire
from nodefabric_deviceplugin.allocate import UnknownToken, grant
from nodefabric_deviceplugin.api import deviceplugin_pb2 as pb
from nodefabric_deviceplugin.preferred import preferred
from nodefabric_deviceplugin.resources import Family, FamilyView, PluginConfig, view
from nodefabric_deviceplugin.source import RecordSource
from nodefabric_deviceplugin.verbs import VerbsUnresolvable

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET = "kubelet.sock"
REGISTER_TIMEOUT_S = 5.0
MAX_BACKOFF_S = 5.0


def socket_name(family: Family) -> str:
    return f"nodefabric-{family.value}.sock"


class DevicePluginServicer(rpc.DevicePluginServicer):
    """One family's DevicePlugin service. Every answer is rebuilt from the source's latest record."""

    def __init__(self, family: Family, config: PluginConfig, source: RecordSource, host: HostRoot) -> None:
        self.family = family
        self.config = config
        self.source = source
        self.host = host
        self.resource = config.resource_name(family)
        self._cached: tuple[int, FamilyView] | None = None

    def view(self) -> FamilyView:
        """The family's tokens from the latest record (derived once per record version, never stored)."""
        version, spec = self.source.snapshot()
        if self._cached is None or self._cached[0] != version:
            self._cached = (version, view(spec, self.family, self.config.shared_count))
        return self._cached[1]

    async def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.aio.ServicerContext[pb.Empty, pb.DevicePluginOptions]
    ) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    async def ListAndWatch(
        self, request: pb.Empty, context: grpc.aio.ServicerContext[pb.Empty, pb.ListAndWatchResponse]
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        # Never returns on its own: kubelet marks every device Unhealthy when this stream ends.
        last: pb.ListAndWatchResponse | None = None
        while True:
            version = self.source.version
            current = self.view()
            message = wire.device_list(current)
            if message != last:
                healthy = sum(1 for t in current.tokens if t.endpoint.healthy)
                metrics.DEVICES.labels(self.family.value, "healthy").set(healthy)
                metrics.DEVICES.labels(self.family.value, "unhealthy").set(len(current.tokens) - healthy)
                fields: dict[str, object] = {
                    "resource": self.resource,
                    "devices": len(current.tokens),
                    "healthy": healthy,
                }
                # Which endpoint is down and what its ports read, so "why is allocatable short" needs no
                # second tool.
                down = [f"{e.rdma_device} ({e.reason})" for e in current.endpoints if not e.healthy]
                if down:
                    fields["unhealthy"] = down
                log.info("sending the device list", extra=fields)
                yield message
                last = message
            await self.source.changed(version)

    async def GetPreferredAllocation(
        self,
        request: pb.PreferredAllocationRequest,
        context: grpc.aio.ServicerContext[pb.PreferredAllocationRequest, pb.PreferredAllocationResponse],
    ) -> pb.PreferredAllocationResponse:
        current = self.view()
        out = pb.PreferredAllocationResponse()
        for req in request.container_requests:
            ids = preferred(
                current, list(req.available_deviceIDs), list(req.must_include_deviceIDs), req.allocation_size
            )
            metrics.PREFERRED_ALLOCATIONS.labels(self.family.value).inc()
            out.container_responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return out

    async def Allocate(
        self,
        request: pb.AllocateRequest,
        context: grpc.aio.ServicerContext[pb.AllocateRequest, pb.AllocateResponse],
    ) -> pb.AllocateResponse:
        current = self.view()
        out = pb.AllocateResponse()
        for req in request.container_requests:
            ids = list(req.devices_ids)
            try:
                granted = grant(self.host, current, ids)
            except UnknownToken as exc:
                metrics.ALLOCATIONS.labels(self.family.value, "unknown_device").inc()
                log.warning(
                    "refused an allocation",
                    extra={"resource": self.resource, "devices": ids, "why": str(exc)},
                )
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            except VerbsUnresolvable as exc:
                metrics.ALLOCATIONS.labels(self.family.value, "unresolvable_verbs").inc()
                log.error(
                    "allocation failed: no verbs device",
                    extra={
                        "resource": self.resource,
                        "devices": ids,
                        "rdma_device": exc.rdma_device,
                        "why": str(exc),
                    },
                )
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            metrics.ALLOCATIONS.labels(self.family.value, "granted").inc()
            log.info(
                "allocated",
                extra={
                    "resource": self.resource,
                    "devices": ids,
                    "rdma_devices": [e.rdma_device for e in granted.endpoints],
                    "device_nodes": [d.path for d in granted.devices],
                },
            )
            out.container_responses.append(wire.container_response(granted))
        return out

    async def PreStartContainer(
        self,
        request: pb.PreStartContainerRequest,
        context: grpc.aio.ServicerContext[pb.PreStartContainerRequest, pb.PreStartContainerResponse],
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


def _identity(path: str) -> tuple[int, int, int] | None:
    """Which file is at `path` now (inode numbers are reused on tmpfs, so the ctime is part of it)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


@dataclass
class _Registration:
    kubelet: tuple[int, int, int] | None = None  # the kubelet.sock we registered with
    failed_for: tuple[int, int, int] | None = None  # the kubelet.sock the last attempt failed with
    failures: int = 0
    next_try: float = 0.0

    def due(self, kubelet: tuple[int, int, int], now: float) -> bool:
        # A new kubelet is tried at once; the same one that refused us waits out the backoff.
        return self.kubelet != kubelet and (self.failed_for != kubelet or self.next_try <= now)


class FamilyServer:
    """One family's gRPC server on `<plugin dir>/nodefabric-<family>.sock`."""

    def __init__(self, servicer: DevicePluginServicer, plugin_dir: str) -> None:
        self.servicer = servicer
        self.family = servicer.family
        self.plugin_dir = plugin_dir
        self.endpoint = socket_name(servicer.family)
        self.path = os.path.join(plugin_dir, self.endpoint)
        self._server: grpc.aio.Server | None = None
        self._socket: tuple[int, int, int] | None = None
        self.registration = _Registration()
        self.serve_failures = 0
        self.serve_retry_at = 0.0

    async def serve(self) -> None:
        """(Re)start serving on a fresh socket file."""
        await self.stop()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # a stale socket from a previous run refuses the bind
        server = grpc.aio.server()
        rpc.add_device_plugin_servicer(self.servicer, server)
        server.add_insecure_port(f"unix://{self.path}")
        await server.start()
        self._server = server
        self._socket = _identity(self.path)
        self.registration = _Registration()
        log.info("serving", extra={"resource": self.servicer.resource, "socket": self.path})

    def needs_serving(self) -> bool:
        """Not serving yet, or our socket file was deleted or replaced (kubelet restarts delete it)."""
        return self._server is None or _identity(self.path) != self._socket

    async def register(self) -> None:
        """Register with kubelet; raises grpc.aio.AioRpcError when kubelet refuses or cannot be reached."""
        kubelet = os.path.join(self.plugin_dir, KUBELET_SOCKET)
        async with grpc.aio.insecure_channel(f"unix://{kubelet}") as channel:
            stub = rpc.registration_stub(channel)
            await stub.Register(
                pb.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.endpoint,
                    resource_name=self.servicer.resource,
                    options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
                ),
                timeout=REGISTER_TIMEOUT_S,
            )

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace=None)
            # Only our own socket file: kubelet may already have put something else there.
            if _identity(self.path) == self._socket:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
        self._socket = None


class DevicePluginManager:
    """Runs the served families: serve, register, follow kubelet restarts, stop cleanly.

    In the agent:

        source = RecordSource()
        manager = DevicePluginManager(source, HostRoot.at(root), config=PluginConfig(shared_count=64))
        task = asyncio.create_task(manager.run(stop))
        source.update(spec)          # after every agent pass
    """

    def __init__(
        self,
        source: RecordSource,
        host: HostRoot,
        *,
        config: PluginConfig | None = None,
        plugin_dir: str = DEFAULT_PLUGIN_DIR,
        poll_interval: float = 0.1,
    ) -> None:
        self.source = source
        self.host = host
        self.config = config or PluginConfig()
        self.plugin_dir = plugin_dir
        self.poll_interval = poll_interval
        self.servers = [
            FamilyServer(DevicePluginServicer(f, self.config, source, host), plugin_dir)
            for f in self.config.families()
        ]
        self.serving = asyncio.Event()  # set once every family is serving and registered at least once

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set. Waits for the first record: a failed read is not an empty host."""
        os.makedirs(self.plugin_dir, exist_ok=True)
        if self.source.spec is None:
            log.info("waiting for the first device record before registering")
            first = asyncio.ensure_future(self.source.first())
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait({first, stopped}, return_when=asyncio.FIRST_COMPLETED)
            first.cancel()
            stopped.cancel()
            if stop.is_set():
                return
        try:
            while not stop.is_set():
                await self.reconcile()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.poll_interval)
        finally:
            for server in self.servers:
                await server.stop()
            log.info("stopped serving", extra={"plugin_dir": self.plugin_dir})

    async def reconcile(self) -> None:
        """One watch step: re-serve a deleted socket, (re-)register with a new kubelet."""
        kubelet = _identity(os.path.join(self.plugin_dir, KUBELET_SOCKET))
        now = asyncio.get_running_loop().time()
        for server in self.servers:
            if not server.needs_serving() or server.serve_retry_at > now:
                continue
            if server.registration.kubelet is not None:
                # Routine when kubelet restarts; anything else deleting it is worth a look.
                log.info("our socket was removed; serving again", extra={"socket": server.path})
            try:
                await server.serve()
                server.serve_failures, server.serve_retry_at = 0, 0.0
            except (OSError, RuntimeError) as exc:  # grpc reports a failed bind as RuntimeError
                server.serve_failures += 1
                backoff = min(self.poll_interval * 2**server.serve_failures, MAX_BACKOFF_S)
                server.serve_retry_at = now + backoff
                log.error(
                    "cannot serve; will retry",
                    extra={"socket": server.path, "why": str(exc), "retry_in_s": round(backoff, 2)},
                )
        if kubelet is None:
            return
        due = [s for s in self.servers if not s.needs_serving() and s.registration.due(kubelet, now)]
        await asyncio.gather(*(self._register(s, kubelet) for s in due))
        if all(s.registration.kubelet is not None for s in self.servers):
            self.serving.set()

    async def _register(self, server: FamilyServer, kubelet: tuple[int, int, int]) -> None:
        reg = server.registration
        try:
            await server.register()
        except grpc.aio.AioRpcError as exc:
            reg.failures += 1
            backoff = min(self.poll_interval * 2**reg.failures, MAX_BACKOFF_S)
            reg.kubelet, reg.failed_for = None, kubelet
            reg.next_try = asyncio.get_running_loop().time() + backoff
            metrics.REGISTRATIONS.labels(server.family.value, "failed").inc()
            log.error(
                "registration with kubelet failed; will retry",
                extra={
                    "resource": server.servicer.resource,
                    "code": exc.code().name,
                    "why": exc.details(),
                    "retry_in_s": round(backoff, 2),
                },
            )
            return
        reg.kubelet, reg.failed_for, reg.failures = kubelet, None, 0
        metrics.REGISTRATIONS.labels(server.family.value, "ok").inc()
        log.info(
            "registered with kubelet", extra={"resource": server.servicer.resource, "socket": server.path}
        )
