"""The RDMA link check: does a bound RDMA device's link actually carry traffic?

Verdict per RDMA device, from every port's `state` and `phys_state` read as whole enum names:
- ok: some port is ACTIVE with phys_state LinkUp (one working port serves traffic);
- failed: every port was read and none is ACTIVE/LinkUp; the reason carries the port values verbatim;
- unverified: no port is ok and at least one could not be read or parsed, or there are no ports to read.
  Failed is never reached from a file that could not be read: an inability to ask is not an answer of no.
ACTIVE_DEFER is a port that lost its link, so it is compared as a whole name and never matches ACTIVE.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from nodefabric_devicemanager.hostroot import HostReadError, SysDir
from nodefabric_devicemanager.models import LinkState, LinkVerdict

log = logging.getLogger(__name__)

ACTIVE = "ACTIVE"
LINK_UP = "LinkUp"

# The kernel prints both attributes as "%d: %s"; the name may contain a space ("Phy Test").
_ENUM = re.compile(r"^\s*(\d+):\s*(\S(?:.*\S)?)\s*$")


@dataclass(frozen=True, slots=True)
class PortReading:
    """One port as read. `state`/`phys_state` are the raw attribute text; `error` says why not readable."""

    port: str
    state: str | None = None
    phys_state: str | None = None
    error: str = ""


def enum_name(raw: str | None) -> str | None:
    """The whole enum name of "4: ACTIVE" ("ACTIVE"); None when the text is not in the kernel's form."""
    if raw is None:
        return None
    m = _ENUM.match(raw)
    return m[2] if m else None


def _port_text(p: PortReading) -> str:
    return f"port {p.port} state {p.state!r} phys_state {p.phys_state!r}"


def verdict(device: str, ports: Sequence[PortReading]) -> LinkVerdict:
    """Pure: the verdict for one RDMA device from its port readings."""
    if not ports:
        return LinkVerdict(state=LinkState.UNVERIFIED, reason=f"{device}: no ports to read")
    unknown: list[str] = []
    for p in ports:
        if p.error:
            unknown.append(f"port {p.port} unreadable: {p.error}")
            continue
        state, phys = enum_name(p.state), enum_name(p.phys_state)
        if state == ACTIVE and phys == LINK_UP:
            return LinkVerdict(state=LinkState.OK, reason=f"{device}: port {p.port} {ACTIVE} {LINK_UP}")
        if state is None or phys is None:
            unknown.append(f"{_port_text(p)} not in the kernel's form")
    if unknown:
        return LinkVerdict(state=LinkState.UNVERIFIED, reason=f"{device}: " + "; ".join(unknown))
    return LinkVerdict(state=LinkState.FAILED, reason=f"{device}: " + "; ".join(_port_text(p) for p in ports))


def _read_port(ports: SysDir, name: str) -> PortReading:
    try:
        d = ports.child(name)
        return PortReading(port=name, state=d.read("state"), phys_state=d.read("phys_state"))
    except FileNotFoundError as exc:
        missing = os.path.basename(str(exc.filename)) if exc.filename else "port directory"
        return PortReading(port=name, error=f"{missing} is missing")
    except HostReadError as exc:
        return PortReading(port=name, error=str(exc))


def read_ports(device: SysDir) -> list[PortReading]:
    """Every port of one RDMA device directory (`.../infiniband/<dev>`); raises HostReadError when the
    ports directory cannot be listed, FileNotFoundError when it is absent."""
    ports = device.child("ports")
    return [_read_port(ports, name) for name in sorted(ports.list(), key=_port_order)]


def _port_order(name: str) -> tuple[int, str]:
    return (int(name), name) if name.isdigit() else (1 << 31, name)


def check(device: SysDir) -> LinkVerdict:
    """Thin reader: the verdict for the RDMA device directory `device`, never raising for host trouble."""
    try:
        readings = read_ports(device)
    except FileNotFoundError:
        readings = []
    except HostReadError as exc:
        log.warning("could not read rdma ports", extra={"device": device.name, "error": str(exc)})
        return LinkVerdict(state=LinkState.UNVERIFIED, reason=f"{device.name}: ports unreadable: {exc}")
    result = verdict(device.name, readings)
    if result.state is LinkState.FAILED:
        log.warning("rdma link is down", extra={"device": device.name, "reason": result.reason})
    return result


@dataclass(frozen=True, slots=True)
class Binding:
    """The RDMA side of one PCI function: the bound device name ("" when none) and its verdict."""

    device: str
    link: LinkVerdict | None


def binding(function_dir: SysDir) -> Binding:
    """RDMA device bound to a PCI function (`<fn>/infiniband/<dev>`) and its link verdict.

    No `infiniband` directory: no device, no verdict. One that exists but cannot be read: no device name
    (nothing to hand a container) and an unverified verdict, so the node still counts as usable.
    """
    try:
        ib = function_dir.child_opt("infiniband")
        if ib is None:
            return Binding("", None)
        names = ib.list()
    except HostReadError as exc:
        log.error(
            "could not read the rdma devices of a pci function",
            extra={"path": function_dir.shown, "error": str(exc)},
        )
        return Binding("", LinkVerdict(state=LinkState.UNVERIFIED, reason=f"rdma devices unreadable: {exc}"))
    if not names:
        return Binding("", None)
    # One function binds one RDMA device; a second would be a kernel oddity, and the first is kept stable.
    if len(names) > 1:
        log.warning(
            "pci function has several rdma devices", extra={"path": function_dir.shown, "devices": names}
        )
    try:
        dev = ib.child(names[0])
    except (FileNotFoundError, HostReadError) as exc:
        return Binding(
            names[0], LinkVerdict(state=LinkState.UNVERIFIED, reason=f"{names[0]}: unreadable: {exc}")
        )
    return Binding(names[0], check(dev))
