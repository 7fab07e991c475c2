"""Accelerator fixtures for tests and the demo: GPUs and NPUs in sysfs trees, KFD topologies, and
recorded vendor-library answers served at the library's own edge.

    from nodefabric_devicemanager.testing.accelerators import FakeNvml, RecordedGpu, nvswitch_node

    b = SysfsBuilder(tmp_path)
    nvml = nvswitch_node(b, cluster_uuid=bytes.fromhex("5b0e1122..."), clique_id=1)  # 8 GPUs, NVSwitch
    reading = detect(HostRoot.at(b.root), pci.walk(HostRoot.at(b.root)), Libraries(nvidia=Nvml(nvml)))

`FakeNvml` stands in for the `pynvml` module: the code under test calls the same functions with the same
arguments (fabric structs passed with ctypes.byref, filled in place), and gets pynvml's real structs and
real NVMLError subclasses back.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any, cast

import pynvml

from nodefabric_devicemanager.accelerators.ascend import AscendAnswer
from nodefabric_devicemanager.accelerators.fabric import SuperPodInfo
from nodefabric_devicemanager.accelerators.library import LibraryUnavailable
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder

NVIDIA_VENDOR = "10de"
H100_SXM = "2330"
NVIDIA_3D_CLASS = "030200"
NVIDIA_VGA_CLASS = "030000"
NVIDIA_AUDIO_CLASS = "040300"
NVSWITCH_CLASS = "068000"
AMD_VENDOR = "1002"
MI300X = "74a1"
AMD_ACCEL_CLASS = "120000"
ASCEND_VENDOR = "19e5"
ASCEND_910 = "d802"

SWITCH = "switch"  # an NVLink whose far end is an NVSwitch


@dataclass
class RecordedFabric:
    """One nvmlGpuFabricInfo_v3 answer."""

    state: int = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    status: int = pynvml.NVML_SUCCESS
    cluster_uuid: bytes = bytes(16)
    clique_id: int = 0
    health_mask: int = 0


@dataclass
class RecordedGpu:
    bus_id: str  # as NVML spells it: "00000000:1B:00.0"
    fabric: RecordedFabric | int | None = (
        None  # an int is the NVML error the query returns; None: NOT_SUPPORTED
    )
    links: list[str | None] = field(default_factory=list)  # per link: SWITCH, a peer bus id, None (inactive)
    only_v2: bool = False  # a driver that predates the v3 fabric struct


def _error(code: int) -> Exception:
    err: Exception = pynvml.NVMLError(code)
    return err


class FakeNvml:
    """Recorded NVML answers behind pynvml's function names."""

    NVMLError = pynvml.NVMLError
    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS
    c_nvmlGpuFabricInfo_v2_t = pynvml.c_nvmlGpuFabricInfo_v2_t
    c_nvmlGpuFabricInfo_v3_t = pynvml.c_nvmlGpuFabricInfo_v3_t

    def __init__(self, gpus: list[RecordedGpu], *, init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.calls: list[str] = []
        self.initialized = 0

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise _error(self.init_error)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")
        self.initialized -= 1

    def _gpu(self, handle: Any) -> RecordedGpu:
        if self.initialized <= 0:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        return self.gpus[int(handle)]

    def nvmlDeviceGetCount(self) -> int:
        if self.initialized <= 0:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._gpu(index)
        return index

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        info = pynvml.nvmlPciInfo_t()
        info.busId = self._gpu(handle).bus_id.encode()
        return info

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, ref: Any) -> int:
        gpu = self._gpu(handle)
        self.calls.append("nvmlDeviceGetGpuFabricInfoV")
        if not isinstance(ref, type(ctypes.byref(ctypes.c_int()))):
            # The real function takes a pointer; a struct passed by value is a caller bug.
            raise TypeError("nvmlDeviceGetGpuFabricInfoV takes ctypes.byref(struct)")
        info: Any = cast(Any, ref)._obj  # the struct behind the pointer, filled in place as NVML does
        if gpu.only_v2 and info.version != pynvml.nvmlGpuFabricInfo_v2:
            raise _error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if gpu.fabric is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if isinstance(gpu.fabric, int):
            raise _error(gpu.fabric)
        f = gpu.fabric
        ctypes.memmove(info.clusterUuid, f.cluster_uuid, 16)
        info.status = f.status
        info.cliqueId = f.clique_id
        info.state = f.state
        info.healthMask = f.health_mask
        return int(pynvml.NVML_SUCCESS)

    def _link(self, handle: Any, link: int) -> str | None:
        gpu = self._gpu(handle)
        if link >= len(gpu.links):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT if gpu.links else pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.links[link]

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        return 0 if self._link(handle, link) is None else 1

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        far = self._link(handle, link)
        if far is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(
            pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH if far == SWITCH else pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
        )

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Any, link: int) -> Any:
        far = self._link(handle, link)
        if far is None or far == SWITCH:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        info = pynvml.nvmlPciInfo_t()
        info.busId = far.encode()
        return info


def nvml_bus_id(sysfs_bus_id: str) -> str:
    """NVML's spelling of a sysfs address: 8-digit domain, uppercase hex."""
    domain, rest = sysfs_bus_id.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}"


# H100 SXM HGX board bus ids (one per PCIe switch, two switches per socket quadrant)
HGX_GPUS = [
    "0000:1b:00.0",
    "0000:43:00.0",
    "0000:52:00.0",
    "0000:61:00.0",
    "0000:9d:00.0",
    "0000:c3:00.0",
    "0000:d1:00.0",
    "0000:df:00.0",
]


def gpu_function(
    b: SysfsBuilder,
    bus_id: str,
    *,
    parent: str | None = None,
    numa: int | None = 0,
    device: str = H100_SXM,
    class_code: str = NVIDIA_3D_CLASS,
    audio: bool = False,
) -> None:
    """An NVIDIA GPU function (and optionally its HDMI audio function at .1, which is not an accelerator)."""
    b.function(
        bus_id,
        parent=parent,
        vendor=NVIDIA_VENDOR,
        device=device,
        class_code=class_code,
        numa=numa,
        cpus="0-55" if numa == 0 else "56-111",
    )
    if audio:
        b.function(
            bus_id[:-1] + "1",
            parent=parent,
            vendor=NVIDIA_VENDOR,
            device="22ba",
            class_code=NVIDIA_AUDIO_CLASS,
            numa=numa,
        )


def nvswitch_node(
    b: SysfsBuilder,
    *,
    cluster_uuid: bytes = bytes(16),
    clique_id: int = 0,
    state: int = pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED,
    links_per_gpu: int = 18,
    nics: bool = True,
) -> FakeNvml:
    """An 8-GPU HGX H100 node: each GPU behind its own PCIe switch port (two GPUs, or a GPU and a NIC, per
    switch), four per socket, every GPU with `links_per_gpu` NVLinks to the NVSwitches. Returns its NVML.

    The fabric answer is the same on every GPU: pass a uuid and state COMPLETED for a multi-node NVLink
    clique member (GB200 NVL72-style), or leave the default NOT_SUPPORTED for a single HGX board.
    """
    for i, gpu in enumerate(HGX_GPUS):
        socket = 0 if i < 4 else 1
        domain, bus = gpu.split(":")[:2]
        root = f"{domain}:{int(bus, 16) - 3:02x}:01.0"
        up = f"{domain}:{int(bus, 16) - 2:02x}:00.0"
        down = f"{domain}:{int(bus, 16) - 1:02x}:00.0"
        b.bridge(root, host_bridge=f"pci{domain}:{int(bus, 16) - 3:02x}")
        b.switch(up, [down], parent=root)
        gpu_function(b, gpu, parent=down, numa=socket)
        if nics:
            nic_bus = f"{domain}:{int(bus, 16) + 1:02x}:00.0"
            nic_down = f"{domain}:{int(bus, 16) - 1:02x}:01.0"
            b.function(nic_down, parent=up, vendor="1000", device="c030", class_code="060400", numa=socket)
            b.nic(
                nic_bus, f"ibp{int(bus, 16) + 1}s0", parent=nic_down, numa=socket, rdma=f"mlx5_{i}", verbs=i
            )
    fabric = RecordedFabric(state=state, cluster_uuid=cluster_uuid, clique_id=clique_id)
    return FakeNvml(
        [
            RecordedGpu(nvml_bus_id(g), fabric=fabric if state else None, links=[SWITCH] * links_per_gpu)
            for g in HGX_GPUS
        ]
    )


# --- AMD KFD ----------------------------------------------------------------------------------------------


def kfd_topology(
    b: SysfsBuilder,
    gpus: list[tuple[str, int]],
    *,
    cpu_nodes: int = 2,
    cpu_hive: int = 0,
    xgmi: bool = True,
) -> None:
    """/sys/class/kfd/kfd/topology/nodes: `cpu_nodes` CPU nodes (gpu_id 0, carrying `cpu_hive` as an APU's
    CPU node can), then one node per (bus id, hive id) GPU; with `xgmi`, an XGMI io_link between every
    pair of GPUs sharing a non-zero hive."""
    base = "/sys/class/kfd/kfd/topology/nodes"
    for n in range(cpu_nodes):
        b.write(f"{base}/{n}/gpu_id", "0")
        b.write(f"{base}/{n}/properties", f"cpu_cores_count 96\nsimd_count 0\nhive_id {cpu_hive}\n")
    for k, (bus_id, hive) in enumerate(gpus):
        node = cpu_nodes + k
        domain, bus, devfn = bus_id.split(":")
        dev, fn = devfn.split(".")
        location = (int(bus, 16) << 8) | (int(dev, 16) << 3) | int(fn)
        b.write(f"{base}/{node}/gpu_id", str(40000 + k * 1111))
        b.write(
            f"{base}/{node}/properties",
            f"cpu_cores_count 0\nsimd_count 1216\nlocation_id {location}\ndomain {int(domain, 16)}\n"
            f"drm_render_minor {128 + k}\nhive_id {hive}\nnum_xgmi 7\n",
        )
        b.write(f"{base}/{node}/io_links/0/properties", f"type 2\nnode_from {node}\nnode_to 0\nweight 20\n")
        if xgmi and hive:
            j = 1
            for other, (_, other_hive) in enumerate(gpus):
                if other != k and other_hive == hive:
                    b.write(
                        f"{base}/{node}/io_links/{j}/properties",
                        f"type 11\nnode_from {node}\nnode_to {cpu_nodes + other}\nweight 15\n",
                    )
                    j += 1


def amd_gpu(b: SysfsBuilder, bus_id: str, *, numa: int | None = 0, hive: int | None = None) -> None:
    """An MI300X function; `hive` also writes amdgpu's xgmi_hive_info/xgmi_hive_id beside it."""
    attrs: dict[str, str | bytes] = {}
    if hive is not None:
        attrs["xgmi_hive_info/xgmi_hive_id"] = str(hive)
    b.function(bus_id, vendor=AMD_VENDOR, device=MI300X, class_code=AMD_ACCEL_CLASS, numa=numa, attrs=attrs)


# --- Ascend dcmi ------------------------------------------------------------------------------------------


def npu_function(b: SysfsBuilder, bus_id: str, *, numa: int | None = 0) -> None:
    b.function(bus_id, vendor=ASCEND_VENDOR, device=ASCEND_910, class_code=AMD_ACCEL_CLASS, numa=numa)


class FakeAscend:
    """An AscendLibrary answering with recorded dcmi answers (or refusing, as a node without libdcmi)."""

    def __init__(self, answers: list[AscendAnswer] | None = None, *, unavailable: str = "") -> None:
        self.answers = answers or []
        self.unavailable = unavailable
        self.reads = 0

    def read(self) -> list[AscendAnswer]:
        self.reads += 1
        if self.unavailable:
            raise LibraryUnavailable(self.unavailable)
        return self.answers


def spod(super_pod_id: int, size: int, server_index: int, chassis: int, type_code: int) -> SuperPodInfo:
    return SuperPodInfo(
        super_pod_id=super_pod_id,
        super_pod_size=size,
        server_index=server_index,
        chassis_id=chassis,
        super_pod_type=type_code,
    )
