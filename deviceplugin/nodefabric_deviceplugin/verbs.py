"""Resolving an RDMA device name to its verbs character device on the host.

The N of uverbsN is unrelated to the N of mlx5_N, so the name is looked up, never derived: first in the
verbs class (`/sys/class/infiniband_verbs/uverbs*/ibdev`), then under the RDMA device's own PCI function
(`/sys/class/infiniband/<dev>/device/infiniband_verbs/`). Which layout a live host answers through has
not been read yet, so both are tried, and a failure names every location checked.

Reading is blocking I/O and runs off the event loop (`VerbsCache`, through `offloop`). One read of the
class answers every device of a record, so the answer is cached per record: an Allocate that finds its
devices in the cache costs no sysfs read, only an lstat of each device node to notice a driver reload
(the kernel then recreates the nodes, possibly renumbered). A device missing from the cache, a record
change or a changed node sends the next Allocate back to sysfs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from nodefabric_devicemanager.hostroot import HostReadError, HostRoot, SysDir
from nodefabric_deviceplugin.offloop import SingleFlight
from nodefabric_deviceplugin.resources import valid_rdma_device

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
        if not valid_rdma_device(rdma_device):
            raise VerbsUnresolvable(rdma_device[:70], ["(not a valid RDMA device name)"])
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


# (st_dev, st_ino, st_rdev, st_ctime_ns) of a device node: a node the kernel recreated differs.
Identity = tuple[int, int, int, int]


def node_identity(host: HostRoot, path: str) -> Identity | None:
    """Which file is at a host path now, without opening or following it (never blocks on a FIFO)."""
    return _lstat_identity(host.host_path(path))


def _lstat_identity(joined: str) -> Identity | None:
    try:
        st = os.lstat(joined)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_rdev, st.st_ctime_ns)


@dataclass(frozen=True, slots=True)
class VerbsDevices:
    """What the host said about some RDMA devices: each one's verbs node, or why it has none."""

    nodes: Mapping[str, str]  # rdma device -> "/dev/infiniband/uverbsN"
    unresolved: Mapping[str, VerbsUnresolvable]
    rdma_cm: bool  # /dev/infiniband/rdma_cm exists


@dataclass(frozen=True, slots=True)
class VerbsTable:
    """One read of the host's verbs devices, with the identity of every node it named."""

    nodes: Mapping[str, tuple[str, Identity]]
    unresolved: Mapping[str, VerbsUnresolvable]
    rdma_cm: Identity | None
    asked: frozenset[str]  # the devices this read was asked about (the class may name more)

    def answers(self, wanted: Iterable[str]) -> bool:
        return all(name in self.nodes or name in self.asked for name in wanted)

    def devices(self, wanted: Iterable[str]) -> VerbsDevices:
        nodes: dict[str, str] = {}
        unresolved: dict[str, VerbsUnresolvable] = {}
        for name in wanted:
            if name in self.nodes:
                nodes[name] = self.nodes[name][0]
            else:
                unresolved[name] = self.unresolved.get(name) or VerbsUnresolvable(name, ["(not read)"])
        return VerbsDevices(nodes, unresolved, self.rdma_cm is not None)


def read_table(host: HostRoot, wanted: Iterable[str]) -> VerbsTable:
    """Read the verbs class once and resolve every device it names plus `wanted`. Blocking I/O."""
    index = VerbsIndex(host)
    asked = frozenset(wanted)
    nodes: dict[str, tuple[str, Identity]] = {}
    unresolved: dict[str, VerbsUnresolvable] = {}
    for name in sorted(set(index.by_ibdev) | asked):
        try:
            path = index.resolve(name)
        except VerbsUnresolvable as exc:
            unresolved[name] = exc
            continue
        identity = node_identity(host, path)
        if identity is None:  # gone between the two looks
            unresolved[name] = VerbsUnresolvable(name, [f"{path} (vanished while being read)"])
        else:
            nodes[name] = (path, identity)
    return VerbsTable(nodes, unresolved, node_identity(host, RDMA_CM) if has_rdma_cm(host) else None, asked)


def read_devices(host: HostRoot, wanted: Iterable[str]) -> VerbsDevices:
    """The verbs devices of `wanted`, read now (blocking I/O; see VerbsCache for the cached, async way)."""
    names = list(wanted)
    return read_table(host, names).devices(names)


DEFAULT_READ_BUDGET_S = 2.0


class VerbsCache:
    """The verbs table of the latest record, re-read off the event loop only on a miss.

    A hit is every wanted device in the table with its node unchanged (one lstat each, and one of
    rdma_cm). Anything else reads the host again in a thread, within `budget` seconds; concurrent
    misses share one read, so a read stuck on a blocking file costs one thread, not one per Allocate.
    """

    def __init__(
        self,
        host: HostRoot,
        *,
        budget: float = DEFAULT_READ_BUDGET_S,
        reader: Callable[[HostRoot, Iterable[str]], VerbsTable] = read_table,
    ) -> None:
        self.host = host
        self._reader = reader
        self._flight: SingleFlight[VerbsTable] = SingleFlight(VERBS_CLASS, budget)
        self._version = -1
        self._table: VerbsTable | None = None
        self.generation = 0  # grows with every table read, so answers derived from one can be keyed on it
        # The joined host path of every node in the table: the hit path's only work is one lstat each.
        self._joined: dict[str, str] = {}
        self._rdma_cm = host.host_path(RDMA_CM)

    @property
    def budget(self) -> float:
        return self._flight.budget

    @property
    def reads(self) -> int:
        """Host reads started so far (tests and the benchmark count misses with it)."""
        return self._flight.started

    def invalidate(self) -> None:
        self._table = None

    def fresh(self, version: int, wanted: Iterable[str]) -> bool:
        """Whether the table answers `wanted` under record `version` with every node unchanged: an lstat
        per node, no sysfs read. While it holds, `generation` names the table's answer."""
        table = self._table
        if table is None or version != self._version:
            return False
        for name in wanted:
            entry = table.nodes.get(name)
            if entry is None or _lstat_identity(self._joined[name]) != entry[1]:
                return False
        return _lstat_identity(self._rdma_cm) == table.rdma_cm

    def cached(self, version: int, wanted: list[str]) -> VerbsDevices | None:
        """What `devices` answers when the table holds `wanted` unchanged (see fresh), else None: no
        sysfs read, no await. A thread may ask while no `devices` call can replace the table (the DRA
        Preparer asks from its hop, under the lock its own calls of `devices` take)."""
        if not self.fresh(version, wanted):
            return None
        assert self._table is not None
        return self._table.devices(wanted)

    async def devices(self, version: int, wanted: Iterable[str]) -> VerbsDevices:
        """The verbs devices of `wanted` under record `version`. Raises offloop.ReadTimeout."""
        names = list(dict.fromkeys(wanted))
        hit = self.cached(version, names)
        if hit is not None:
            return hit
        # A read already in flight may have been started for other devices: then one more, for ours.
        for _ in range(2):
            table = await self._flight.run(lambda: self._reader(self.host, names))
            self._table, self._version = table, version
            self.generation += 1
            self._joined = {name: self.host.host_path(path) for name, (path, _) in table.nodes.items()}
            if table.answers(names):
                break
        return table.devices(names)
