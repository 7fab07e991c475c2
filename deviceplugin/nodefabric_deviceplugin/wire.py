"""Conversions between the resource manager's values and the kubelet API messages."""

from __future__ import annotations

from nodefabric_deviceplugin.allocate import PERMISSIONS, ContainerGrant
from nodefabric_deviceplugin.api import deviceplugin_pb2 as pb
from nodefabric_deviceplugin.limits import entry_bytes as device_entry_size
from nodefabric_deviceplugin.resources import HEALTHY, UNHEALTHY, FamilyView, Token


def device(token: Token) -> pb.Device:
    numa = token.endpoint.numa
    # No hint rather than ID -1 or a stand-in 0: under single-numa-node the hint decides admission.
    topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=numa)]) if numa is not None else None
    return pb.Device(ID=token.id, health=HEALTHY if token.endpoint.healthy else UNHEALTHY, topology=topology)


def device_list(view: FamilyView) -> pb.ListAndWatchResponse:
    return pb.ListAndWatchResponse(devices=[device(t) for t in view.tokens])


def container_response(grant: ContainerGrant) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(
        envs=grant.envs,
        devices=[
            pb.DeviceSpec(container_path=d.path, host_path=d.path, permissions=PERMISSIONS)
            for d in grant.devices
        ],
    )


def fit(message: pb.ListAndWatchResponse, limit: int) -> int:
    """Cut the list to its longest prefix that encodes within `limit` bytes; returns how many remain."""
    size = 0
    for kept, d in enumerate(message.devices):
        size += device_entry_size(d.ByteSize())
        if size > limit:
            del message.devices[kept:]
            return kept
    return len(message.devices)
