"""What to tell an operator when one of the agent's conditions changes: a log line and an Event, once.

A condition that stays False is stale data, not news: it is logged and posted when it changes (or on
the first pass after a start), never on every pass. Pure: the agent keeps what it last told.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from nodefabric_devicemanager.models import Condition, DevicesSpec, Endpoint, LinkState

LIBRARY_UNAVAILABLE = "LibraryUnavailable"
LINK_FAILED = "LinkFailed"
LINK_RECOVERED = "LinkRecovered"

# What an operator does about a condition, by (type, reason), where the condition's own message may not say.
REMEDIES: dict[tuple[str, str], str] = {
    ("NvidiaFabricRead", LIBRARY_UNAVAILABLE): (
        "NVIDIA GPUs are on the bus but NVML (libnvidia-ml.so.1) cannot be loaded, so the NVLink fabric "
        "is not read. Run the agent with the NVIDIA runtime class (chart value "
        "agent.runtimeClassName=nvidia), or mount the driver and point the agent at it (chart value "
        "agent.driverRoot, flag --driver-root): "
        "/run/nvidia/driver under the GPU Operator, / for a driver installed on the host."
    ),
}


@dataclass(frozen=True, slots=True)
class Notice:
    condition: str
    level: int  # logging level of the log line
    event_type: str  # "Warning" or "Normal"
    reason: str
    message: str


Told = Mapping[str, tuple[str, str]]  # condition type -> (status, reason) last told


def message_for(cond: Condition) -> str:
    remedy = REMEDIES.get((cond.type, cond.reason), "")
    message = cond.message or f"{cond.type} is {cond.status}"
    if remedy and remedy not in message:
        message = f"{message}. {remedy}" if message else remedy
    return message


def notices(told: Told, reported: Sequence[Condition]) -> list[Notice]:
    """The notices due for `reported` given what was told before: a False condition that is new or
    changed its reason, and a recovery from False. A True condition on the first pass is not news."""
    out: list[Notice] = []
    for cond in sorted(reported, key=lambda c: c.type):
        before = told.get(cond.type)
        now = (cond.status, cond.reason)
        if before == now:
            continue
        if cond.status == "False":
            # A missing library is a setup step to take, not a fault of the host: a warning.
            level = logging.WARNING if cond.reason == LIBRARY_UNAVAILABLE else logging.ERROR
            out.append(Notice(cond.type, level, "Warning", cond.reason or cond.type, message_for(cond)))
        elif before is not None and before[0] == "False":
            out.append(
                Notice(
                    cond.type, logging.INFO, "Normal", cond.reason or cond.type, f"{cond.type} is True again"
                )
            )
    return out


def remember(told: Told, reported: Sequence[Condition]) -> dict[str, tuple[str, str]]:
    return {**told, **{c.type: (c.status, c.reason) for c in reported}}


# --- RDMA links ----------------------------------------------------------------------------------------


def _endpoints(spec: DevicesSpec) -> Iterator[tuple[str, Endpoint]]:
    """Every endpoint by a name an operator recognises: the interface, or `<pf>/<vf bus id>` for a VF."""
    for iface in spec.interfaces:
        yield iface.name, iface
        for vf in iface.virtual_functions:
            yield f"{iface.name}/{vf.pci_bus_id or vf.name}", vf


def _failed(ep: Endpoint | None) -> bool:
    return ep is not None and ep.link is not None and ep.link.state is LinkState.FAILED


def link_notices(before: DevicesSpec, after: DevicesSpec, now: datetime) -> list[Notice]:
    """A notice per endpoint whose link verdict entered or left Failed between the published record
    `before` and the one now published. An endpoint new to the record is not news unless it is failed
    (a card plugged in dead); one that left the record is the interface inventory's news, not a link's.
    Comparing published records, not passes, tells each change once, also across a restart."""
    old = dict(_endpoints(before))
    out: list[Notice] = []
    for name, ep in _endpoints(after):
        was = old.get(name)
        device = ep.rdma_device or "-"
        if _failed(ep) and not _failed(was):
            reason = ep.link.reason if ep.link is not None else ""
            out.append(
                Notice(
                    f"link/{name}",
                    logging.WARNING,
                    "Warning",
                    LINK_FAILED,
                    f"RDMA link of {name} ({device}) failed: {reason}".rstrip(": "),
                )
            )
        elif _failed(was) and not _failed(ep):
            state = ep.link.state.value if ep.link is not None else "no verdict"
            seen = was.link.first_seen_time if was is not None and was.link is not None else None
            down = f" after {max(0, int((now - seen).total_seconds()))} s failed" if seen is not None else ""
            out.append(
                Notice(
                    f"link/{name}",
                    logging.INFO,
                    "Normal",
                    LINK_RECOVERED,
                    f"RDMA link of {name} ({device}) recovered{down}: now {state}",
                )
            )
    return out
