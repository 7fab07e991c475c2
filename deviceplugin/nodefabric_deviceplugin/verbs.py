"""Resolving an RDMA device name to its verbs character device on the host.

The N of uverbsN is unrelated to the N of mlx5_N, so the name is looked up, never derived: first in the
verbs class (`/sys/class/infiniband_verbs/uverbs*/ibdev`), then under the RDMA device's own PCI function
(`/sys/class/infiniband/<dev>/device/infiniband_verbs/`). Which layout a live host answers through has
not been read yet, so both are tried, and a failure names every location checked.
"""

from __future__ import annotations

import re

from nodefabric_devicemanager.hostroot import HostReadError, HostRoot, SysDir

VERBS_CLASS = "/sys/class/infiniband_verbs"
RDMA_CLASS = "/sys/class/infiniband"
DEV_DIR = "/dev/infiniband"
RDMA_CM = f"{DEV_DIR}/rdma_cm"

_UVERBS = re.compile(r"^uverbs\d+$")


class VerbsUnresolvable(Exception):
    """No verbs device could be found for an RDMA device; `checked` names every location looked at."""

    def __init__(self, rdma_device: str, checked: list[str]) -> None:
        super().__init__(f"no verbs device for RDMA device {rdma_device!r}; checked: {'; '.join(checked)}")
        self.rdma_device = rdma_device
        self.checked = checked


def _entries(parent: SysDir) -> list[str]:
    return [name for name in parent.list() if _UVERBS.match(name)]


class VerbsIndex:
    """The host's verbs class read once (ibdev -> uverbsN): one Allocate reads it once for every endpoint."""

    def __init__(self, host: HostRoot) -> None:
        self.host = host
        self.by_ibdev: dict[str, str] = {}
        self.class_problem = ""  # why the class could not answer, for diagnostics
        self.class_entries = 0
        if not host.exists(VERBS_CLASS):
            self.class_problem = "absent"
            return
        try:
            verbs = host.dir(VERBS_CLASS)
            names = _entries(verbs)
            for name in names:
                ibdev = verbs.child(name).read_opt("ibdev")
                if ibdev is not None:
                    self.by_ibdev.setdefault(ibdev, name)
            self.class_entries = len(names)
        except FileNotFoundError:
            self.class_problem = "changed while being read"
        except HostReadError as exc:
            self.class_problem = f"unreadable: {exc.reason}"

    def _under_device(self, rdma_device: str, checked: list[str]) -> str | None:
        where = f"{RDMA_CLASS}/{rdma_device}/device/infiniband_verbs"
        try:
            verbs = self.host.dir(RDMA_CLASS).child(rdma_device).child("device").child("infiniband_verbs")
            entries = _entries(verbs)
            for name in entries:
                if verbs.child(name).read_opt("ibdev") == rdma_device:
                    return name
            # Under one PCI function a lone verbs device with no ibdev attribute can only be that function's.
            if len(entries) == 1 and verbs.child(entries[0]).read_opt("ibdev") is None:
                return entries[0]
        except FileNotFoundError:
            checked.append(f"{where} (absent)")
            return None
        except HostReadError as exc:
            checked.append(f"{where} (unreadable: {exc.reason})")
            return None
        checked.append(f"{where} ({len(entries)} entries, none names {rdma_device})")
        return None

    def resolve(self, rdma_device: str) -> str:
        """The host path of the device's verbs character device, e.g. "/dev/infiniband/uverbs3".

        Raises VerbsUnresolvable when neither sysfs layout names one, or when the named node is missing
        under /dev/infiniband (the container runtime would otherwise fail later with a vaguer error).
        """
        if not rdma_device or "/" in rdma_device or rdma_device in (".", ".."):
            raise VerbsUnresolvable(rdma_device, ["(not a valid RDMA device name)"])
        checked: list[str] = []
        name = self.by_ibdev.get(rdma_device)
        if name is None:
            why = self.class_problem or f"{self.class_entries} entries, none names {rdma_device}"
            checked.append(f"{VERBS_CLASS}/uverbs*/ibdev ({why})")
            name = self._under_device(rdma_device, checked)
        if name is None:
            raise VerbsUnresolvable(rdma_device, checked)
        dev = f"{DEV_DIR}/{name}"
        if not self.host.exists(dev):
            checked.append(f"{dev} (sysfs names it, but the device node is absent)")
            raise VerbsUnresolvable(rdma_device, checked)
        return dev


def resolve_uverbs(host: HostRoot, rdma_device: str) -> str:
    """One device's verbs character device; see VerbsIndex.resolve."""
    return VerbsIndex(host).resolve(rdma_device)


def has_rdma_cm(host: HostRoot) -> bool:
    return host.exists(RDMA_CM)
