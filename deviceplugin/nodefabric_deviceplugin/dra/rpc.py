"""The typed face of the generated DRA and plugin-registration modules (grpcio-tools emits them without
annotations): one `DraVersion` per DRAPlugin service version, keyed as kubelet names them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol, cast

import grpc

from nodefabric_deviceplugin.dra.api import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from nodefabric_deviceplugin.dra.api import pluginregistration_pb2 as reg_pb
from nodefabric_deviceplugin.dra.api import pluginregistration_pb2_grpc as _reg

RegistrationServicer = _reg.RegistrationServicer


class DraStub(Protocol):
    """A DRAPlugin client of either version; requests and responses are that version's messages."""

    def NodePrepareResources(
        self, request: Any, *, timeout: float | None = None
    ) -> grpc.aio.UnaryUnaryCall[Any, Any]: ...

    def NodeUnprepareResources(
        self, request: Any, *, timeout: float | None = None
    ) -> grpc.aio.UnaryUnaryCall[Any, Any]: ...


class RegistrationStub(Protocol):
    def GetInfo(
        self, request: reg_pb.InfoRequest, *, timeout: float | None = None
    ) -> grpc.aio.UnaryUnaryCall[reg_pb.InfoRequest, reg_pb.PluginInfo]: ...

    def NotifyRegistrationStatus(
        self, request: reg_pb.RegistrationStatus, *, timeout: float | None = None
    ) -> grpc.aio.UnaryUnaryCall[reg_pb.RegistrationStatus, reg_pb.RegistrationStatusResponse]: ...


@dataclass(frozen=True, slots=True)
class DraVersion:
    service: str  # as listed in PluginInfo.supported_versions, e.g. "v1.DRAPlugin"
    pb: ModuleType  # the version's messages
    add_servicer: Callable[[Any, grpc.aio.Server], None]
    _stub: Callable[[grpc.aio.Channel], Any]

    def stub(self, channel: grpc.aio.Channel) -> DraStub:
        return cast(DraStub, self._stub(channel))


V1 = DraVersion(
    "v1.DRAPlugin", dra_v1_pb2, dra_v1_pb2_grpc.add_DRAPluginServicer_to_server, dra_v1_pb2_grpc.DRAPluginStub
)
V1BETA1 = DraVersion(
    "v1beta1.DRAPlugin",
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server,
    dra_v1beta1_pb2_grpc.DRAPluginStub,
)
VERSIONS: dict[str, DraVersion] = {v.service: v for v in (V1, V1BETA1)}


def registration_stub(channel: grpc.aio.Channel) -> RegistrationStub:
    return cast(RegistrationStub, cast(Any, _reg.RegistrationStub)(channel))


add_registration_servicer = cast(
    Callable[[Any, grpc.aio.Server], None], _reg.add_RegistrationServicer_to_server
)
