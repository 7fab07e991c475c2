"""Between topology walks: re-read only what changes without a kernel uevent.

A full walk (PCI bus, interfaces, RDMA bindings, accelerators) runs on start, after kernel uevents and
on a slow safety interval. What can change in between without a uevent is link state: an RDMA port's
`state` / `phys_state` and a netdev's `operstate` (rtnetlink reports those, the uevent socket does not).
`carrier` is not read: `operstate` already goes down with the carrier (RFC 2863), and the record holds
no carrier of its own. So between walks only those files are read, from directories resolved and checked
once per walk (`plan`):

- `snapshot` reads them as raw bytes, opened non-blocking without following links: a FIFO or device
  node where an attribute belongs cannot block it, and a symlink reads as a change;
- only a file whose bytes differ from the last snapshot is judged again, and then through the same safe
  reader and verdict code a walk uses (`rdma.check`, `interfaces.is_up`), so a refused file is refused
  with the same message;
- a file that is gone (ENOENT) says the topology changed: the caller walks again.

The steady state is one open/read/close per file and a tuple comparison.
"""

from __future__ import annotations

import errno
import logging
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from nodefabric_devicemanager import interfaces as interfacesmod
from nodefabric_devicemanager import rdma, rdmaclass
from nodefabric_devicemanager.hostroot import HostReadError, HostRoot, SysDir
from nodefabric_devicemanager.models import Endpoint, Interface, LinkVerdict

log = logging.getLogger(__name__)

CLASS_INFINIBAND = "/sys/class/infiniband"
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# One read: sysfs hands over an attribute in one read; anything longer than a page is not a state.
_READ_BYTES = 4096
_UNKNOWN_OPERSTATE = b"unknown\n"

# What one file read as: its bytes, or the errno that refused it.
Value = bytes | int


@dataclass(frozen=True, slots=True)
class _Device:
    name: str
    dir: SysDir
    # Each watched port directory: its name under ports/ (shared, "1"), or its absolute path where it
    # resolved elsewhere. File paths are built per refresh: kept, they were a third of a big node's plan.
    port_dirs: tuple[str, ...]
    # The ports judged, and the interface they ride on, for a device bound by name (a platform engine
    # split across netdevs, soft RoCE); None and "": every port, for every endpoint that names the device.
    ports: frozenset[str] | None = None
    netdev: str = ""

    @property
    def files(self) -> list[str]:
        """Each judged port's state and phys_state, absolute."""
        out: list[str] = []
        for port in self.port_dirs:
            base = port if port.startswith("/") else f"{self.dir.path}/ports/{port}"
            out += (f"{base}/state", f"{base}/phys_state")
        return out


@dataclass(frozen=True, slots=True)
class _Netdev:
    name: str
    dir: SysDir

    @property
    def operstate(self) -> str:
        return f"{self.dir.path}/operstate"

    @property
    def flags(self) -> str:
        return f"{self.dir.path}/flags"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What every watched file read as, in plan order: devices first, then netdevs."""

    values: tuple[Value | tuple[Value, Value], ...]

    @property
    def gone(self) -> bool:
        """A watched file vanished: an interface or RDMA device went away, so the topology changed."""
        return any(_is_gone(v) for v in self.values)


def _is_gone(value: Value | tuple[Value, Value]) -> bool:
    if isinstance(value, tuple):
        return any(_is_gone(v) for v in value)
    return value == errno.ENOENT


@dataclass(frozen=True)
class Plan:
    """The files a refresh reads, resolved and checked once per walk."""

    devices: tuple[_Device, ...] = ()
    netdevs: tuple[_Netdev, ...] = ()
    # Names the record holds but /sys did not resolve at plan time; they are left as the walk read them.
    unresolved: tuple[str, ...] = field(default=())

    @property
    def files(self) -> list[str]:
        """Every file a steady-state refresh reads (for the benchmark's bare-read baseline)."""
        return [f for d in self.devices for f in d.files] + [n.operstate for n in self.netdevs]


def _endpoints(interfaces: Iterable[Interface]) -> Iterable[Endpoint]:
    for iface in interfaces:
        yield iface
        yield from iface.virtual_functions


def _device(host: HostRoot, name: str, netdev: str) -> _Device:
    """The files to watch for one endpoint's RDMA device: the ports the walk judged it over."""
    d = host.dir(f"{CLASS_INFINIBAND}/{name}")
    riding = rdmaclass.ports_on(host, name, netdev)
    only = None if riding is None else frozenset(riding)
    ports = d.child("ports")
    found: list[str] = []
    for port in sorted(ports.list()):
        if only is not None and port not in only:
            continue
        port_dir = ports.child(port)
        plain = port_dir.path == f"{d.path}/ports/{port}"
        found.append(sys.intern(port) if plain else port_dir.path)
    return _Device(name, d, tuple(found), only, netdev if only is not None else "")


def plan(host: HostRoot, interfaces: Sequence[Interface]) -> Plan:
    """What to re-read for the endpoints a walk found: every RDMA device's ports, every netdev."""
    devices: list[_Device] = []
    netdevs: list[_Netdev] = []
    unresolved: list[str] = []
    seen_devices: set[tuple[str, str]] = set()
    seen: set[str] = set()
    for ep in _endpoints(interfaces):
        # A PCI function's device counts every port (the one binding a PCI endpoint can have): no need to
        # ask which ports ride on it, which costs reads on a node of a thousand VFs.
        netdev = "" if ep.bus == "pci" else ep.name
        if ep.rdma_device and (ep.rdma_device, netdev) not in seen_devices:
            seen_devices.add((ep.rdma_device, netdev))
            try:
                devices.append(_device(host, ep.rdma_device, netdev))
            except (HostReadError, FileNotFoundError, ValueError) as exc:
                unresolved.append(ep.rdma_device)
                log.debug("rdma device not refreshed", extra={"device": ep.rdma_device, "error": str(exc)})
        if ep.name and ep.name not in seen:
            seen.add(ep.name)
            try:
                d = host.dir(f"{interfacesmod.CLASS_NET}/{ep.name}")
            except (HostReadError, FileNotFoundError, ValueError) as exc:
                unresolved.append(ep.name)
                log.debug("interface not refreshed", extra={"interface": ep.name, "error": str(exc)})
                continue
            netdevs.append(_Netdev(ep.name, d))
    return Plan(tuple(devices), tuple(netdevs), tuple(unresolved))


def _read(path: str) -> Value:
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        return exc.errno or -1
    try:
        return os.read(fd, _READ_BYTES)
    except OSError as exc:
        return exc.errno or -1
    finally:
        os.close(fd)


def snapshot(p: Plan) -> Snapshot:
    """Every watched file's bytes now. Never blocks on a file, never raises for host trouble."""
    values: list[Value | tuple[Value, Value]] = []
    # One object per distinct value: a snapshot is kept until the next, and on a big node nearly every
    # port reads the same few bytes.
    seen: dict[Value, Value] = {}
    for device in p.devices:
        value = b"".join(v if isinstance(v, bytes) else b"\0%d" % v for v in map(_read, device.files))
        values.append(seen.setdefault(value, value))
    for netdev in p.netdevs:
        operstate = _read(netdev.operstate)
        operstate = seen.setdefault(operstate, operstate)
        # operstate "unknown" (lo, many virtual drivers) falls back to IFF_UP, so flags matter then only.
        values.append((operstate, _read(netdev.flags)) if operstate == _UNKNOWN_OPERSTATE else operstate)
    return Snapshot(tuple(values))


@dataclass(frozen=True, slots=True)
class Changes:
    """What a refresh re-judged: link verdicts by RDMA device (every port), and by (RDMA device,
    interface) for a device bound by name (the ports riding on that interface); `up` by interface name."""

    links: dict[str, LinkVerdict] = field(default_factory=dict)
    up: dict[str, bool] = field(default_factory=dict)
    riding: dict[tuple[str, str], LinkVerdict] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.links or self.up or self.riding)


def _judge_netdev(netdev: _Netdev) -> bool:
    try:
        return interfacesmod.is_up(netdev.dir.read_opt("operstate"), netdev.dir.read_opt("flags"))
    except HostReadError as exc:
        log.warning(
            "could not read an interface's state", extra={"interface": netdev.name, "error": str(exc)}
        )
        return False


def judge(p: Plan, before: Snapshot | None, after: Snapshot) -> Changes:
    """Re-judge, through the walk's own reader and verdict code, every device and netdev whose files
    changed between the snapshots (all of them when there is no `before`)."""
    changes = Changes()
    n = len(p.devices)
    for i, device in enumerate(p.devices):
        if before is None or before.values[i] != after.values[i]:
            if device.ports is None:
                changes.links[device.name] = rdma.check(device.dir)
            else:
                changes.riding[device.name, device.netdev] = rdma.check(device.dir, device.ports)
    for j, netdev in enumerate(p.netdevs):
        if before is None or before.values[n + j] != after.values[n + j]:
            changes.up[netdev.name] = _judge_netdev(netdev)
    return changes


def _updated(ep: Endpoint, changes: Changes) -> dict[str, object]:
    update: dict[str, object] = {}
    link = changes.riding.get((ep.rdma_device, ep.name)) or changes.links.get(ep.rdma_device)
    if ep.rdma_device and link is not None and ep.link != link:
        update["link"] = link
    if ep.name and ep.name in changes.up and ep.up != changes.up[ep.name]:
        update["up"] = changes.up[ep.name]
    return update


def apply(interfaces: list[Interface], changes: Changes) -> list[Interface]:
    """The interfaces with the re-judged facts; the same list object when no endpoint changed."""
    if not changes:
        return interfaces
    out: list[Interface] = []
    changed = False
    for iface in interfaces:
        vfs = []
        vfs_changed = False
        for vf in iface.virtual_functions:
            update = _updated(vf, changes)
            vfs.append(vf.model_copy(update=update) if update else vf)
            vfs_changed = vfs_changed or bool(update)
        update = _updated(iface, changes)
        if vfs_changed:
            update["virtual_functions"] = vfs
        out.append(iface.model_copy(update=update) if update else iface)
        changed = changed or bool(update)
    return out if changed else interfaces
