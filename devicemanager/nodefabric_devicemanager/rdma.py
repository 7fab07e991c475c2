"""The RDMA link check: does a bound RDMA device's link actually carry traffic?

Verdict per RDMA device, from every port's `state` and `phys_state` read as whole enum names:
- ok: some port is ACTIVE with phys_state LinkUp (one working port serves traffic);
- failed: every port was read and none is ACTIVE/LinkUp; the reason carries the port values verbatim;
- unverified: no port is ok and at least one could not be read or parsed, or there are no ports to read.
  Failed is never reached from a file that could not be read: an inability to ask is not an answer of no.
ACTIVE_DEFER is a port that lost its link, so it is compared as a whole name and never matches ACTIVE.

A value is parsed only when it is exactly what the kernel prints ("%d: %s" from its own tables, code and
name agreeing): NUL bytes, junk, a name the kernel does not print, or its own "UNKNOWN"/"<unknown>" are
not an answer, so they make the port unverified, never failed.

`verdict(device, ports)` is the one pure function from port readings to a `LinkVerdict`; the full pass
(`binding`, `check`) and a refresh of port state between passes both go through it.
"""

from __future__ import annotations

import errno
import logging
import os
import re
from collections.abc import Collection, Sequence
from typing import NamedTuple

from nodefabric_devicemanager import numbers
from nodefabric_devicemanager.hostroot import HostReadError, Listing, SysDir, recorded_name
from nodefabric_devicemanager.models import LinkState, LinkVerdict

log = logging.getLogger(__name__)

ACTIVE = "ACTIVE"
LINK_UP = "LinkUp"

# The kernel prints both attributes as "%d: %s"; the name may contain a space ("Phy Test").
_ENUM = re.compile(r"\s*([0-9]+):\s*(\S(?:.*\S)?)\s*", re.ASCII | re.DOTALL)
# drivers/infiniband/core/sysfs.c: state_show's and phys_state_to_str's tables. The kernel's own "no
# idea" names (UNKNOWN, <unknown>) are left out: they are no answer either.
STATE_NAMES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
PHYS_STATE_NAMES = {
    1: "Sleep",
    2: "Polling",
    3: "Disabled",
    4: "PortConfigurationTraining",
    5: "LinkUp",
    6: "LinkErrorRecovery",
    7: "Phy Test",
}
_ENUM_CODE = numbers.Quantity("port state code", 0, 0xFF)
# A failed verdict quotes the port values; a value longer than this is quoted in part.
_QUOTE_CHARS = 48


class PortReading(NamedTuple):
    """One port as read. `state`/`phys_state` are the raw attribute text; `error` says why not readable.
    A named tuple, not a frozen dataclass: a pass makes one per port of every VF, and a frozen
    dataclass's __init__ (object.__setattr__ per field) costs three times as much."""

    port: str
    state: str | None = None
    phys_state: str | None = None
    error: str = ""


def enum_name(raw: str | None) -> str | None:
    """The whole enum name of "4: ACTIVE" ("ACTIVE"); None when the text is not in the kernel's form."""
    if raw is None:
        return None
    m = _ENUM.fullmatch(raw)
    return m[2] if m else None


def _known(raw: str | None, table: dict[int, str]) -> str | None:
    """The name, when `raw` is exactly a line of the kernel's table (code and name agreeing)."""
    m = _ENUM.fullmatch(raw) if raw is not None else None
    if m is None:
        return None
    code = numbers.parse_opt(m[1], _ENUM_CODE)
    return m[2] if code is not None and table.get(code) == m[2] else None


@numbers.memo
def port_state(raw: str | None) -> str | None:
    """A port's `state` as the kernel names it ("ACTIVE"); None for anything the kernel would not print."""
    return _known(raw, STATE_NAMES)


@numbers.memo
def phys_state(raw: str | None) -> str | None:
    """A port's `phys_state` as the kernel names it ("LinkUp"); None for anything else."""
    return _known(raw, PHYS_STATE_NAMES)


def _quote(text: str | None) -> str:
    """A value as a verdict reason quotes it: escaped (repr), and only in part when it is long."""
    if text is not None and len(text) > _QUOTE_CHARS:
        return f"{text[:_QUOTE_CHARS]!r}... ({len(text)} characters)"
    return repr(text)


def _port_text(p: PortReading) -> str:
    return f"port {p.port} state {_quote(p.state)} phys_state {_quote(p.phys_state)}"


def verdict(device: str, ports: Sequence[PortReading]) -> LinkVerdict:
    """Pure: the verdict for one RDMA device from its port readings."""
    if not ports:
        return LinkVerdict(state=LinkState.UNVERIFIED, reason=f"{device}: no ports to read")
    unknown: list[str] = []
    for p in ports:
        if p.error:
            unknown.append(f"port {p.port} unreadable: {p.error}")
            continue
        state, phys = port_state(p.state), phys_state(p.phys_state)
        if state == ACTIVE and phys == LINK_UP:
            return LinkVerdict(state=LinkState.OK, reason=f"{device}: port {p.port} {ACTIVE} {LINK_UP}")
        if state is None or phys is None:
            unknown.append(f"{_port_text(p)} not in the kernel's form")
    if unknown:
        return LinkVerdict(state=LinkState.UNVERIFIED, reason=f"{device}: " + "; ".join(unknown))
    return LinkVerdict(state=LinkState.FAILED, reason=f"{device}: " + "; ".join(_port_text(p) for p in ports))


_PORT_ATTRIBUTES = ("state", "phys_state")


def _read_port(ports: Listing, name: str, is_dir: bool) -> PortReading:
    shown = recorded_name(name)
    try:
        state, phys = ports.reads(name, is_dir, _PORT_ATTRIBUTES)
        return PortReading(shown, state, phys)
    except FileNotFoundError as exc:
        missing = os.path.basename(str(exc.filename)) if exc.filename else "port directory"
        return PortReading(port=shown, error=f"{recorded_name(missing)} is missing")
    except HostReadError as exc:
        return PortReading(port=shown, error=str(exc))


def read_ports(
    device: SysDir, only: Collection[str] | None = None, dir_fd: int | None = None
) -> list[PortReading]:
    """Every port of one RDMA device directory (`.../infiniband/<dev>`), or those named in `only`; raises
    HostReadError when the ports directory cannot be listed, FileNotFoundError when it is absent.
    `dir_fd`: a descriptor of `device` (`Listing.held`), to open `ports` relative to."""
    listing = device.child_listing_opt("ports", dir_fd)
    if listing is None:
        raise FileNotFoundError(errno.ENOENT, "no ports directory", f"{device.path}/ports")
    try:  # each port's state read relative to the descriptor that listed them
        entries = listing.entries
        if only is not None:
            entries = [e for e in entries if e[0] in only]
        # A listing has each name once; sorted by port number (entries are sorted by name already, and
        # nearly every device has one port).
        if len(entries) > 1:
            entries = sorted(entries, key=lambda e: _port_order(e[0]))
        return [_read_port(listing, name, is_dir) for name, is_dir in entries]
    finally:
        listing.close()


@numbers.memo
def _port_number(name: str | None) -> int | None:
    return numbers.parse_opt(name, numbers.PORT_NUMBER)


def _port_order(name: str) -> tuple[int, str]:
    number = _port_number(name)
    return (number, name) if number is not None else (1 << 31, name)


def check(
    device: SysDir,
    only: Collection[str] | None = None,
    *,
    name: str | None = None,
    dir_fd: int | None = None,
) -> LinkVerdict:
    """Thin reader: the verdict for the RDMA device directory `device` (over the ports in `only`, when a
    device's ports ride on different interfaces), never raising for host trouble. `name`: the device's
    recorded name, when the caller has it already; `dir_fd`: a descriptor of `device` to read relative
    to (`read_ports`)."""
    if name is None:
        name = recorded_name(device.name)
    try:
        readings = read_ports(device, only, dir_fd)
    except FileNotFoundError:
        readings = []
    except HostReadError as exc:
        log.warning("could not read rdma ports", extra={"device": name, "error": str(exc)})
        return LinkVerdict(state=LinkState.UNVERIFIED, reason=f"{name}: ports unreadable: {exc}")
    result = verdict(name, readings)
    if result.state is LinkState.FAILED:
        log.warning("rdma link is down", extra={"device": name, "reason": result.reason})
    return result


class Binding(NamedTuple):
    """The RDMA side of one device: the bound RDMA device name ("" when none) and its verdict.
    `software` marks an RDMA provider emulated in the kernel (rxe, siw) rather than a NIC's own.
    A named tuple for the reason PortReading is one: one per VF."""

    device: str
    link: LinkVerdict | None
    software: bool = False


NO_BINDING = Binding("", None)


def binding(function_dir: SysDir) -> Binding:
    """RDMA device bound to a device (`<dev dir>/infiniband/<rdma dev>`) and its link verdict: a PCI
    function, or a platform device whose netdev hangs from the same parent.

    No `infiniband` directory: no device, no verdict. One that exists but cannot be read: no device name
    (nothing to hand a container) and an unverified verdict, so the node still counts as usable.
    """
    try:
        ib = function_dir.child_listing_opt("infiniband")
    except HostReadError as exc:
        log.error(
            "could not read the rdma devices of a pci function",
            extra={"path": function_dir.shown, "error": str(exc)},
        )
        return Binding("", LinkVerdict(state=LinkState.UNVERIFIED, reason=f"rdma devices unreadable: {exc}"))
    if ib is None:
        return NO_BINDING
    # The device directory is opened relative to the listing's descriptor and its ports relative to that
    # (`Listing.held`), not by the whole path.
    with ib:
        entries = ib.entries
        if not entries:
            return NO_BINDING
        # One function binds one RDMA device; a second would be a kernel oddity, and the first is kept
        # stable.
        if len(entries) > 1:
            names = [n for n, _ in entries]
            log.warning(
                "pci function has several rdma devices", extra={"path": function_dir.shown, "devices": names}
            )
        first, is_dir = entries[0]
        name = recorded_name(first)
        try:
            dev, fd = ib.held(first, is_dir)
        except (FileNotFoundError, HostReadError) as exc:
            return Binding(name, LinkVerdict(state=LinkState.UNVERIFIED, reason=f"{name}: unreadable: {exc}"))
        # Closed before the listing is (inside its `with`): whatever interrupts the listing's close,
        # this descriptor is not left open.
        try:
            # The name as listed is the directory's own: `held` of a real directory keeps it, and a link
            # it followed is named by the entry, as `check` would name it by where it landed.
            return Binding(name, check(dev, name=name if is_dir else None, dir_fd=fd))
        finally:
            if fd is not None:
                os.close(fd)
