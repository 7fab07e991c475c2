"""The kubelet-facing gRPC servers of the DRA driver, each on its own unix socket.

- the DRA socket `<plugin dir>/<driver>/dra.sock` serves DRAPlugin in both versions (v1 and v1beta1), so
  a kubelet of either generation finds the one it speaks;
- the registration socket `<registry dir>/<driver>-reg.sock` serves kubelet's plugin-registration
  service: kubelet's plugin watcher finds it, asks GetInfo, dials the DRA socket, and reports back.

The DRA socket is served first: kubelet dials it as soon as it has read GetInfo. A socket file that is
deleted or replaced under us (a cleanup, a kubelet that wipes its directories) is served again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import grpc

from nodefabric_deviceplugin.dra import metrics, rpc
from nodefabric_deviceplugin.dra.api import pluginregistration_pb2 as reg_pb
from nodefabric_deviceplugin.dra.claims import ClaimRef
from nodefabric_deviceplugin.dra.config import PLUGIN_TYPE, SERVICES, DriverConfig
from nodefabric_deviceplugin.dra.prepare import Preparer
from nodefabric_deviceplugin.unixserver import UnixServer

log = logging.getLogger(__name__)

RETRY_BASE_S = 0.2


def _refs(request: Any) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]


class DraPluginServicer:
    """DRAPlugin of one API version; both versions answer through the same Preparer."""

    def __init__(self, version: rpc.DraVersion, preparer: Preparer) -> None:
        self.version = version
        self.preparer = preparer

    async def NodePrepareResources(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        pb = self.version.pb
        out = pb.NodePrepareResourcesResponse()
        for uid, result in (await self.preparer.prepare(_refs(request))).items():
            entry = out.claims[uid]
            entry.error = result.error
            for d in result.devices:
                entry.devices.add(
                    request_names=d.request_names,
                    pool_name=d.pool,
                    device_name=d.device,
                    cdi_device_ids=d.cdi_device_ids,
                )
        return out

    async def NodeUnprepareResources(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        pb = self.version.pb
        out = pb.NodeUnprepareResourcesResponse()
        for uid, error in (await self.preparer.unprepare(_refs(request))).items():
            out.claims[uid].error = error
        return out


class RegistrationService(rpc.RegistrationServicer):
    """What kubelet's plugin watcher asks us, and what it answers."""

    def __init__(self, config: DriverConfig, on_registered: Callable[[], None] = lambda: None) -> None:
        self.config = config
        self.on_registered = on_registered
        self.registered = asyncio.Event()
        self.last_error = ""

    def info(self) -> reg_pb.PluginInfo:
        return reg_pb.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.config.driver,
            endpoint=self.config.dra_socket,
            supported_versions=list(SERVICES),
        )

    async def GetInfo(
        self, request: reg_pb.InfoRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> reg_pb.PluginInfo:
        return self.info()

    async def NotifyRegistrationStatus(
        self, request: reg_pb.RegistrationStatus, context: grpc.aio.ServicerContext[Any, Any]
    ) -> reg_pb.RegistrationStatusResponse:
        if request.plugin_registered:
            metrics.REGISTRATIONS.labels("ok").inc()
            self.last_error = ""
            self.registered.set()
            log.info("registered with kubelet", extra={"driver": self.config.driver})
            self.on_registered()
        else:
            metrics.REGISTRATIONS.labels("failed").inc()
            self.last_error = request.error
            self.registered.clear()
            log.error(
                "kubelet refused the registration",
                extra={"driver": self.config.driver, "why": request.error, "socket": self.config.dra_socket},
            )
        return reg_pb.RegistrationStatusResponse()


class DraServers:
    """The DRA socket and the registration socket, kept served in that order."""

    def __init__(self, config: DriverConfig, preparer: Preparer, registration: RegistrationService) -> None:
        def add_dra(server: grpc.aio.Server) -> None:
            for version in rpc.VERSIONS.values():
                version.add_servicer(DraPluginServicer(version, preparer), server)

        def add_registration(server: grpc.aio.Server) -> None:
            rpc.add_registration_servicer(registration, server)

        self.dra = UnixServer(config.dra_socket, add_dra, "DRA plugin", grace=1.0)
        self.registration = UnixServer(
            config.registration_socket, add_registration, "plugin registration", grace=1.0
        )

    async def reconcile(self, now: float, retry_base: float = RETRY_BASE_S) -> None:
        """Serve each socket that is not served (or was deleted or replaced), the DRA socket first; one
        that failed is tried again after a backoff."""
        for server in (self.dra, self.registration):
            if server is self.registration and self.dra.needs_serving():
                return  # never advertise an endpoint that is not answering
            if server.due(now):
                await server.serve_again(now, retry_base)

    def next_retry(self, now: float) -> float | None:
        """Seconds until the first socket that needs serving, in `reconcile`'s order, is tried again (0 when
        its retry fell due while the last look ran: a slow serve of the DRA socket outlasted the
        registration socket's backoff, and nothing else would wake us before the safety poll); None when
        none needs serving. The registration socket waits for the DRA socket, never the other way."""
        for server in (self.dra, self.registration):
            if server.needs_serving():
                return max(0.0, server.retry_at - now)
        return None

    async def stop(self) -> None:
        # Registration first: kubelet's watcher sees the socket go and stops calling the DRA socket.
        await self.registration.stop()
        await self.dra.stop()
