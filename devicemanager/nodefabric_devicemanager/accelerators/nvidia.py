"""NVIDIA through NVML (nvidia-ml-py's `pynvml` module): fabric registration and NVLink peers per GPU.

The boundary is `NvidiaLibrary.read()`; `Nvml` implements it over `pynvml` (or any object with the same
functions, which is how the tests hand it recorded answers), `NoNvidia` is the null fallback. With a
driver root (driverroot.py), the real pynvml is handed the driver's own libnvidia-ml; when NVML cannot be
loaded at all, the answer says how to fix it.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from nodefabric_devicemanager.accelerators import driverroot
from nodefabric_devicemanager.accelerators.library import LibraryError, LibraryUnavailable, normalize_bus_id

if TYPE_CHECKING:
    from nodefabric_devicemanager.accelerators.fabric import NvlinkFabricInfo

log = logging.getLogger(__name__)

# nvmlReturn_t values and enums this module branches on (stable across NVML releases).
_NOT_SUPPORTED = 3
_INVALID_ARGUMENT = 2
_DRIVER_NOT_LOADED = 9
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_ARGUMENT_VERSION_MISMATCH = 25
_DEVICE_TYPE_GPU = 0
_DEVICE_TYPE_SWITCH = 2
_MAX_LINKS_FALLBACK = 18
_NOT_FOUND = "NVML Shared Library Not Found"  # pynvml's text for _LIBRARY_NOT_FOUND


def _library_loads() -> bool:
    """Whether the dynamic loader finds libnvidia-ml (one dlopen; kept loaded when it does, as pynvml
    would keep it)."""
    import ctypes  # here, not at the top: only a GPU node asks

    try:
        ctypes.CDLL(driverroot.LIBRARY)
    except OSError:
        return False
    return True


@dataclass
class NvidiaAnswer:
    """What NVML said about one GPU."""

    bus_id: str  # sysfs form
    fabric: NvlinkFabricInfo | None = None  # None: this GPU or driver has no fabric query
    nvlink_peers: dict[str, int] = field(default_factory=dict)  # peer GPU bus id -> active direct links
    nvswitch_links: int = 0  # active links to an NVSwitch
    errors: list[str] = field(default_factory=list)  # questions NVML refused for this GPU


class NvidiaLibrary(Protocol):
    def read(self) -> list[NvidiaAnswer]:
        """Every GPU NVML sees. Raises LibraryUnavailable or LibraryError."""
        ...


class NoNvidia:
    """The null fallback: says the library is missing, so the fabric is recorded as unread."""

    def __init__(self, reason: str = "nvidia-ml-py is not installed") -> None:
        self.reason = reason

    def read(self) -> list[NvidiaAnswer]:
        raise LibraryUnavailable(self.reason)


def _bus_text(pci_info: Any) -> str:
    return normalize_bus_id(pci_info.busId)


class Nvml:
    """NvidiaLibrary over pynvml. `nvml` is the module (default: import pynvml on first use, after loading
    libnvidia-ml from `driver_root` when one is configured: the argument, else $NVIDIA_DRIVER_ROOT)."""

    def __init__(self, nvml: Any | None = None, *, driver_root: str | None = None) -> None:
        self._nvml = nvml
        self._driver_root = driver_root
        self._load_problem = ""  # why the driver root's library did not load, for the answer

    def _module(self) -> Any:
        if self._nvml is None:
            root = driverroot.configured(self._driver_root)
            if root is not None:
                try:
                    driverroot.preload(root)
                except LibraryUnavailable as exc:
                    # The loader's own search may still find one (the NVIDIA runtime mounts it).
                    self._load_problem = str(exc)
            if "pynvml" not in sys.modules and importlib.util.find_spec("pynvml") and not _library_loads():
                # pynvml's first call would fail on this same dlopen (on Linux it asks for the library by
                # name, nothing else) with this message: said here, a GPU node without the library does
                # not import pynvml's 5,000 lines (~20 ms) on every pass to learn it. Once pynvml is
                # imported there is nothing to spare, and its own load decides.
                raise LibraryUnavailable(self._load_problem or f"nvml: {_NOT_FOUND}: {driverroot.REMEDY}")
            try:
                self._nvml = importlib.import_module("pynvml")
            except ImportError as exc:
                raise LibraryUnavailable(f"cannot import pynvml: {exc}") from exc
        return self._nvml

    def read(self) -> list[NvidiaAnswer]:
        nv = self._module()
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == _LIBRARY_NOT_FOUND:
                raise LibraryUnavailable(self._load_problem or f"nvml: {exc}: {driverroot.REMEDY}") from exc
            if code in (_DRIVER_NOT_LOADED, _FUNCTION_NOT_FOUND):
                raise LibraryUnavailable(f"nvml: {exc}") from exc
            raise LibraryError(f"nvml init: {exc}") from exc
        try:
            try:
                count = nv.nvmlDeviceGetCount()
            except nv.NVMLError as exc:
                raise LibraryError(f"nvml device count: {exc}") from exc
            answers = []
            for index in range(count):
                try:
                    handle = nv.nvmlDeviceGetHandleByIndex(index)
                    bus_id = _bus_text(nv.nvmlDeviceGetPciInfo(handle))
                except nv.NVMLError as exc:
                    # A GPU NVML cannot even name is one whose fabric nobody read.
                    raise LibraryError(f"nvml device {index}: {exc}") from exc
                answer = NvidiaAnswer(bus_id=bus_id)
                self._read_fabric(nv, handle, answer)
                self._read_nvlinks(nv, handle, answer)
                answers.append(answer)
            return answers
        finally:
            try:
                nv.nvmlShutdown()
            except nv.NVMLError as exc:
                log.debug("nvml shutdown failed", extra={"error": str(exc)})

    @staticmethod
    def _read_fabric(nv: Any, handle: Any, answer: NvidiaAnswer) -> None:
        # Imported here, not at the top: every inventory imports this module, only a GPU node reads NVML.
        import ctypes

        from nodefabric_devicemanager.accelerators.fabric import NvlinkFabricInfo

        # v3 first; a driver that predates it answers ARGUMENT_VERSION_MISMATCH and gets v2.
        for struct_name in ("c_nvmlGpuFabricInfo_v3_t", "c_nvmlGpuFabricInfo_v2_t"):
            struct = getattr(nv, struct_name, None)
            if struct is None:
                continue
            info = struct()
            try:
                nv.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
            except nv.NVMLError as exc:
                code = getattr(exc, "value", None)
                if code == _ARGUMENT_VERSION_MISMATCH:
                    continue
                if code in (_NOT_SUPPORTED, _FUNCTION_NOT_FOUND):
                    return  # an ordinary card or an older driver: no fabric, and that is an answer
                answer.errors.append(f"fabric info: {exc}")
                return
            answer.fabric = NvlinkFabricInfo(
                cluster_uuid=bytes(info.clusterUuid),
                status=int(info.status),
                clique_id=int(info.cliqueId),
                state=int(info.state) & 0xFF,
            )
            return
        answer.errors.append("fabric info: no fabric struct version this driver accepts")

    @staticmethod
    def _read_nvlinks(nv: Any, handle: Any, answer: NvidiaAnswer) -> None:
        peers: Counter[str] = Counter()
        for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", _MAX_LINKS_FALLBACK))):
            try:
                active = nv.nvmlDeviceGetNvLinkState(handle, link)
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) in (_NOT_SUPPORTED, _INVALID_ARGUMENT, _FUNCTION_NOT_FOUND):
                    continue  # no such link on this GPU
                answer.errors.append(f"nvlink {link} state: {exc}")
                continue
            if not active:
                continue
            try:
                kind = nv.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
            except nv.NVMLError:
                kind = _DEVICE_TYPE_GPU  # older drivers lack the query; the remote address decides below
            if kind == _DEVICE_TYPE_SWITCH:
                answer.nvswitch_links += 1
                continue
            if kind != _DEVICE_TYPE_GPU:
                continue
            try:
                peers[_bus_text(nv.nvmlDeviceGetNvLinkRemotePciInfo(handle, link))] += 1
            except nv.NVMLError as exc:
                answer.errors.append(f"nvlink {link} remote: {exc}")
        answer.nvlink_peers = dict(peers)


def nvlink_width(a: NvidiaAnswer | None, b: NvidiaAnswer | None) -> int:
    """Links joining two GPUs: direct links, plus the narrower side's links when both reach NVSwitches.

    That is how `nvidia-smi topo -m` counts: on an NVSwitch board every GPU pair reads NV<links per GPU>.
    """
    if a is None or b is None:
        return 0
    direct = max(a.nvlink_peers.get(b.bus_id, 0), b.nvlink_peers.get(a.bus_id, 0))
    switched = min(a.nvswitch_links, b.nvswitch_links)
    return direct + switched
