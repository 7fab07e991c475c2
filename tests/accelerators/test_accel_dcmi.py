"""The dcmi ctypes boundary, against a recorded libdcmi that fills the caller's structs in place."""

from __future__ import annotations

import ctypes

import pytest

from nodefabric_devicemanager import inventory
from nodefabric_devicemanager.accelerators import Libraries
from nodefabric_devicemanager.accelerators.ascend import Dcmi
from nodefabric_devicemanager.accelerators.fabric import INVALID
from nodefabric_devicemanager.accelerators.library import LibraryError, LibraryUnavailable
from nodefabric_devicemanager.accelerators.nvidia import NoNvidia
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.testing.accelerators import npu_function
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder

EID = bytes.fromhex("000000000044030000100000df101500")


class RecordedDcmi:
    """libdcmi's functions as a CDLL exposes them; out-parameters arrive as ctypes.byref pointers."""

    def __init__(self, *, init=0, spod_ret=0, urma=True, eid_fail=()):
        self.init = init
        self.spod_ret = spod_ret
        self.eid_fail = set(eid_fail)
        if urma:
            self.dcmi_get_urma_device_cnt = self._urma_cnt
            self.dcmi_get_eid_list_by_urma_dev_index = self._eids

    def dcmi_init(self):
        return self.init

    def dcmi_get_card_list(self, count, cards, length):
        count._obj.value = 2
        cards[0], cards[1] = 0, 1
        return 0

    def dcmi_get_device_num_in_card(self, card, num):
        num._obj.value = 1
        return 0

    def dcmi_get_device_pcie_info_v2(self, card, device, info):
        pcie = info._obj
        pcie.domain, pcie.bdf_busid, pcie.bdf_deviceid, pcie.bdf_funcid = 0, 0xC1 + card, 0, 0
        return 0

    def dcmi_get_mainboard_id(self, card, device, board):
        board._obj.value = 0x44
        return 0

    def dcmi_get_device_info(self, card, device, main_cmd, sub_cmd, buf, size):  # noqa: PLR0917 (the C signature)
        assert (main_cmd, sub_cmd) == (12, 1)
        assert size._obj.value == 48  # struct dcmi_spod_info is 48 bytes
        if self.spod_ret:
            return self.spod_ret
        s = buf._obj
        s.super_pod_id, s.super_pod_size, s.server_index, s.chassis_id, s.super_pod_type = (
            7,
            384,
            card,
            INVALID,
            1,
        )
        return 0

    def _urma_cnt(self, card, device, count):
        count._obj.value = 2
        return 0

    def _eids(self, card, device, index, eids, count):
        if index in self.eid_fail:
            return -8005
        assert count._obj.value == 32
        ctypes.memmove(eids[0].eid, EID, 16)
        count._obj.value = 1
        return 0


def test_reads_every_npu_with_its_super_pod_and_endpoints():
    answers = Dcmi(RecordedDcmi()).read()
    assert [a.bus_id for a in answers] == ["0000:c1:00.0", "0000:c2:00.0"]
    a = answers[1]
    assert a.mainboard_id == 0x44
    assert a.spod is not None
    assert (a.spod.super_pod_id, a.spod.super_pod_size, a.spod.server_index, a.spod.chassis_id) == (
        7,
        384,
        1,
        INVALID,
    )
    assert a.endpoints == [EID.hex(), EID.hex()]
    assert a.errors == []


def test_one_unreadable_urma_device_keeps_the_others():
    a = Dcmi(RecordedDcmi(eid_fail={0})).read()[0]
    assert a.endpoints == [EID.hex()]
    assert a.errors == ["urma device 0 endpoints: dcmi returned -8005"]


def test_generation_without_urma_has_no_endpoints():
    a = Dcmi(RecordedDcmi(urma=False)).read()[0]
    assert (a.endpoints, a.errors) == ([], [])


def test_super_pod_query_refused_is_recorded_not_guessed():
    a = Dcmi(RecordedDcmi(spod_ret=-8255)).read()[0]
    assert a.spod is None
    assert a.errors == ["super pod info: dcmi returned -8255"]


def test_init_failure_and_missing_library():
    with pytest.raises(LibraryError, match="dcmi_init returned -8020"):
        Dcmi(RecordedDcmi(init=-8020)).read()
    with pytest.raises(LibraryUnavailable, match="cannot load"):
        Dcmi(path="libdcmi-not-here.so").read()


# --- a libdcmi without an entry point we call is an unavailable library ------------------------------------


@pytest.fixture
def b(tmp_path):
    return SysfsBuilder(tmp_path / "root")


class OldDcmi:
    """A driver's libdcmi as ctypes exposes it, from before dcmi_get_mainboard_id: that attribute is
    missing, exactly as a CDLL raises AttributeError for a symbol the library does not export."""

    def dcmi_init(self) -> int:
        return 0

    def dcmi_get_card_list(self, count, cards, length) -> int:
        count._obj.value = 1
        cards[0] = 0
        return 0

    def dcmi_get_device_num_in_card(self, card, num) -> int:
        num._obj.value = 1
        return 0

    def dcmi_get_device_pcie_info_v2(self, card, device, info) -> int:
        pcie = info._obj
        pcie.domain, pcie.bdf_busid, pcie.bdf_deviceid, pcie.bdf_funcid = 0, 0xC1, 0, 0
        return 0


def test_dcmi_missing_an_entry_point_is_library_unavailable():
    with pytest.raises(LibraryUnavailable, match="dcmi_get_mainboard_id"):
        Dcmi(OldDcmi()).read()


def test_old_dcmi_still_lists_the_npus_and_the_interfaces(b):
    b.nic("0000:17:00.0", "ens1np0", host_bridge="pci0000:16", numa=0, rdma="mlx5_0")
    npu_function(b, "0000:c1:00.0", numa=1)

    reading = inventory.read(
        HostRoot.at(b.root), libraries=Libraries(nvidia=NoNvidia(), ascend=Dcmi(OldDcmi()))
    )

    assert reading.interfaces is not None and [i.name for i in reading.interfaces] == ["ens1np0"]
    (group,) = reading.groups
    assert [a.id for a in group.accelerators] == ["0000:c1:00.0"]
    cond = next(c for c in reading.conditions if c.type == "AscendFabricRead")
    assert (cond.status, cond.reason) == ("False", "LibraryUnavailable")
