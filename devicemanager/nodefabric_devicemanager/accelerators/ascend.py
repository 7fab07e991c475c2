"""Huawei Ascend super pod information through dcmi (libdcmi.so), behind a small interface.

`AscendLibrary.read()` is the boundary; `Dcmi` implements it with ctypes over the driver's libdcmi,
`NoAscend` is the null fallback. Tests hand the detector recorded answers at this boundary.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from nodefabric_devicemanager.accelerators.fabric import SuperPodInfo, endpoint_hex
from nodefabric_devicemanager.accelerators.library import LibraryError, LibraryUnavailable

log = logging.getLogger(__name__)

_MAIN_CMD_CHIP_INF = 12
_SUB_CMD_SPOD_INFO = 1
_MAX_CARDS = 64
_MAX_URMA_DEVICES = 128  # the vendor's own bound; a larger count is disbelieved
_MAX_EIDS = 32


@dataclass
class AscendAnswer:
    bus_id: str
    mainboard_id: int | None = None
    spod: SuperPodInfo | None = None
    endpoints: list[str] = field(default_factory=list)  # UB endpoint ids, 32 lowercase hex each
    errors: list[str] = field(default_factory=list)


class AscendLibrary(Protocol):
    def read(self) -> list[AscendAnswer]:
        """Every NPU dcmi sees. Raises LibraryUnavailable or LibraryError."""
        ...


class NoAscend:
    def __init__(self, reason: str = "libdcmi.so is not available") -> None:
        self.reason = reason

    def read(self) -> list[AscendAnswer]:
        raise LibraryUnavailable(self.reason)


class _PcieInfoAll(ctypes.Structure):
    _fields_ = [
        ("venderid", ctypes.c_uint),
        ("subvenderid", ctypes.c_uint),
        ("deviceid", ctypes.c_uint),
        ("subdeviceid", ctypes.c_uint),
        ("domain", ctypes.c_int),
        ("bdf_busid", ctypes.c_uint),
        ("bdf_deviceid", ctypes.c_uint),
        ("bdf_funcid", ctypes.c_uint),
        ("reserve", ctypes.c_ubyte * 32),
    ]


class _SpodInfo(ctypes.Structure):
    _fields_ = [
        ("sdid", ctypes.c_uint),
        ("super_pod_size", ctypes.c_uint),
        ("super_pod_id", ctypes.c_uint),
        ("server_index", ctypes.c_uint),
        ("chassis_id", ctypes.c_uint),
        ("super_pod_type", ctypes.c_uint),
        ("reserve", ctypes.c_uint * 6),
    ]


class _EidInfo(ctypes.Structure):
    _fields_ = [("eid", ctypes.c_ubyte * 16), ("eid_index", ctypes.c_uint), ("_pad", ctypes.c_uint)]


class Dcmi:
    """AscendLibrary over libdcmi.so (card/device addressing). `lib` may be a loaded CDLL or a fake."""

    def __init__(self, lib: Any | None = None, path: str = "libdcmi.so") -> None:
        self._lib = lib
        self._path = path

    def _load(self) -> Any:
        if self._lib is None:
            try:
                self._lib = ctypes.CDLL(self._path)
            except OSError as exc:
                raise LibraryUnavailable(f"cannot load {self._path}: {exc}") from exc
        return self._lib

    def read(self) -> list[AscendAnswer]:
        lib = self._load()
        try:
            return self._read(lib)
        except AttributeError as exc:
            # ctypes raises AttributeError for a symbol an older driver's libdcmi does not export: that
            # driver cannot be asked, which must not escape as an exception that sinks the whole pass.
            raise LibraryUnavailable(f"{self._path} lacks an entry point this reader needs: {exc}") from exc

    def _read(self, lib: Any) -> list[AscendAnswer]:
        if (ret := lib.dcmi_init()) != 0:
            raise LibraryError(f"dcmi_init returned {ret}")
        count = ctypes.c_int(0)
        cards = (ctypes.c_int * _MAX_CARDS)()
        if (ret := lib.dcmi_get_card_list(ctypes.byref(count), cards, _MAX_CARDS)) != 0:
            raise LibraryError(f"dcmi_get_card_list returned {ret}")
        answers: list[AscendAnswer] = []
        for card in list(cards)[: min(count.value, _MAX_CARDS)]:
            devices = ctypes.c_int(0)
            if (ret := lib.dcmi_get_device_num_in_card(card, ctypes.byref(devices))) != 0:
                raise LibraryError(f"dcmi_get_device_num_in_card({card}) returned {ret}")
            for device in range(devices.value):
                answers.append(self._device(lib, card, device))
        return answers

    @staticmethod
    def _device(lib: Any, card: int, device: int) -> AscendAnswer:
        pcie = _PcieInfoAll()
        if (ret := lib.dcmi_get_device_pcie_info_v2(card, device, ctypes.byref(pcie))) != 0:
            raise LibraryError(f"dcmi_get_device_pcie_info_v2({card}, {device}) returned {ret}")
        answer = AscendAnswer(
            bus_id=f"{pcie.domain:04x}:{pcie.bdf_busid:02x}:{pcie.bdf_deviceid:02x}.{pcie.bdf_funcid:x}"
        )
        board = ctypes.c_uint(0)
        if (ret := lib.dcmi_get_mainboard_id(card, device, ctypes.byref(board))) == 0:
            answer.mainboard_id = board.value
        else:
            answer.errors.append(f"mainboard id: dcmi returned {ret}")
        spod = _SpodInfo()
        size = ctypes.c_uint(ctypes.sizeof(spod))
        ret = lib.dcmi_get_device_info(
            card, device, _MAIN_CMD_CHIP_INF, _SUB_CMD_SPOD_INFO, ctypes.byref(spod), ctypes.byref(size)
        )
        if ret == 0:
            answer.spod = SuperPodInfo(
                super_pod_id=spod.super_pod_id,
                super_pod_size=spod.super_pod_size,
                server_index=spod.server_index,
                chassis_id=spod.chassis_id,
                super_pod_type=spod.super_pod_type,
            )
        else:
            answer.errors.append(f"super pod info: dcmi returned {ret}")
        answer.endpoints = Dcmi._endpoints(lib, card, device, answer)
        return answer

    @staticmethod
    def _endpoints(lib: Any, card: int, device: int, answer: AscendAnswer) -> list[str]:
        if not hasattr(lib, "dcmi_get_urma_device_cnt"):
            return []  # generations before UB have no endpoints to list
        count = ctypes.c_uint(0)
        if (ret := lib.dcmi_get_urma_device_cnt(card, device, ctypes.byref(count))) != 0:
            answer.errors.append(f"urma device count: dcmi returned {ret}")
            return []
        if count.value > _MAX_URMA_DEVICES:
            answer.errors.append(f"urma device count {count.value} is out of range")
            return []
        out: list[str] = []
        for index in range(count.value):
            eids = (_EidInfo * _MAX_EIDS)()
            n = ctypes.c_uint(_MAX_EIDS)
            ret = lib.dcmi_get_eid_list_by_urma_dev_index(card, device, index, eids, ctypes.byref(n))
            if ret != 0:
                # One unreadable urma device does not sink the others: a shorter list is still a list.
                answer.errors.append(f"urma device {index} endpoints: dcmi returned {ret}")
                continue
            out.extend(endpoint_hex(bytes(e.eid)) for e in list(eids)[: min(n.value, _MAX_EIDS)])
        return out
