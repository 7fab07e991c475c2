"""The typed face of the generated gRPC module (grpcio-tools emits it without annotations)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, cast

import grpc

from nodefabric_deviceplugin.api import deviceplugin_pb2 as pb
from nodefabric_deviceplugin.api import deviceplugin_pb2_grpc as _generated

DevicePluginServicer = _generated.DevicePluginServicer
RegistrationServicer = _generated.RegistrationServicer


class RegistrationStub(Protocol):
    def Register(
        self, request: pb.RegisterRequest, *, timeout: float | None = None
    ) -> grpc.aio.UnaryUnaryCall[pb.RegisterRequest, pb.Empty]: ...


class DevicePluginStub(Protocol):
    def GetDevicePluginOptions(
        self, request: pb.Empty, *, timeout: float | None = None
    ) -> grpc.aio.UnaryUnaryCall[pb.Empty, pb.DevicePluginOptions]: ...

    def ListAndWatch(
        self, request: pb.Empty, *, timeout: float | None = None
    ) -> grpc.aio.UnaryStreamCall[pb.Empty, pb.ListAndWatchResponse]: ...

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, *, timeout: float | None = None
    ) -> grpc.aio.UnaryUnaryCall[pb.PreferredAllocationRequest, pb.PreferredAllocationResponse]: ...

    def Allocate(
        self, request: pb.AllocateRequest, *, timeout: float | None = None
    ) -> grpc.aio.UnaryUnaryCall[pb.AllocateRequest, pb.AllocateResponse]: ...

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, *, timeout: float | None = None
    ) -> grpc.aio.UnaryUnaryCall[pb.PreStartContainerRequest, pb.PreStartContainerResponse]: ...


def registration_stub(channel: grpc.aio.Channel) -> RegistrationStub:
    return cast(RegistrationStub, cast(Any, _generated.RegistrationStub)(channel))


def device_plugin_stub(channel: grpc.aio.Channel) -> DevicePluginStub:
    return cast(DevicePluginStub, cast(Any, _generated.DevicePluginStub)(channel))


add_device_plugin_servicer = cast(
    Callable[[Any, grpc.aio.Server], None], _generated.add_DevicePluginServicer_to_server
)
add_registration_servicer = cast(
    Callable[[Any, grpc.aio.Server], None], _generated.add_RegistrationServicer_to_server
)
