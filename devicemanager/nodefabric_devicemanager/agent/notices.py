"""What to tell an operator when one of the agent's conditions changes: a log line and an Event, once.

A condition that stays False is stale data, not news: it is logged and posted when it changes (or on
the first pass after a start), never on every pass. Pure: the agent keeps what it last told.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nodefabric_devicemanager.models import Condition

LIBRARY_UNAVAILABLE = "LibraryUnavailable"

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
