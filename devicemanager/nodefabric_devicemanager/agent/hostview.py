"""What the agent last read of the host, and the two reads that renew it: the walk and the refresh.

A walk reads the whole host (PCI bus, interfaces, RDMA bindings, accelerators) and plans a refresh; a
refresh reads only the files that change without a uevent (`refresh.py`: RDMA port state and netdev
operstate) and falls back to a walk when there is nothing planned or a watched file vanished. Both run
through the one host read with a deadline (`hostpoll.HostReads`): a read stuck past it fails the pass,
is reported (log, metric; the pass turns it into a condition) and never blocks a SIGTERM.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from nodefabric_devicemanager import hostpoll, refresh
from nodefabric_devicemanager.agent import publish
from nodefabric_devicemanager.agent.metrics import AgentMetrics
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import (
    ACCELERATORS_ENUMERATED,
    INTERFACES_ENUMERATED,
    AcceleratorGroup,
    Condition,
    DevicesSpec,
    Interface,
)

log = logging.getLogger("nodefabric_devicemanager.agent.core")  # one logger for the agent's passes

Reader = Callable[[HostRoot], publish.ReadingLike]

READ_TIMEOUT = "ReadTimeout"
INVENTORY_ERROR = "InventoryError"


def default_reader(host: HostRoot) -> publish.ReadingLike:
    from nodefabric_devicemanager import inventory

    return inventory.read(host)


def now() -> datetime:
    # The API stores times at second precision; a finer local value would never compare equal to it.
    return datetime.now(UTC).replace(microsecond=0)


class PassKind(enum.StrEnum):
    WALK = "walk"
    REFRESH = "refresh"
    SYNC = "sync"


@dataclass
class Observed:
    """What the host read as, kept between passes: the last walk, with refreshed link facts."""

    interfaces: list[Interface] | None
    groups: list[AcceleratorGroup] = field(default_factory=list)
    failed_manufacturers: set[str] = field(default_factory=set)
    conditions: list[Condition] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class HostError:
    """Why this pass has no reading of the host: the message for the condition, and its reason."""

    message: str
    reason: str


def failed_reading(error: str, reason: str, spec: DevicesSpec | None) -> Observed:
    """Stands in for a reading when the host read raised or timed out: nothing was read, so everything
    recorded is kept."""
    manufacturers = {g.id for g in spec.groups} if spec is not None else set()
    message = f"the host could not be read ({error}); the recorded data is kept"
    return Observed(
        interfaces=None,
        failed_manufacturers=manufacturers,
        conditions=[
            Condition(type=INTERFACES_ENUMERATED, status="False", reason=reason, message=message),
            Condition(type=ACCELERATORS_ENUMERATED, status="False", reason=reason, message=message),
        ],
    )


class HostView:
    """The last observation of the host, renewed by walks and refreshes; `generation` grows with it."""

    def __init__(
        self, node: str, host: HostRoot, reader: Reader, metrics: AgentMetrics, read_timeout: float
    ) -> None:
        self.node = node
        self.host = host
        self.reader = reader
        self.metrics = metrics
        self.read_timeout = read_timeout
        self.observed: Observed | None = None
        self.generation = 0  # grows whenever `observed` changes
        self.walk_wanted = True
        self.last_walk: float | None = None
        self.performed = PassKind.WALK  # what the last read was (a refresh may have walked instead)
        self._plan: refresh.Plan | None = None
        self._snapshot: refresh.Snapshot | None = None
        self._reads = hostpoll.HostReads(read_timeout)

    def stuck_for(self) -> float:
        return self._reads.stuck_for()

    def walk_due(self, walk_interval: float) -> bool:
        return (
            self.walk_wanted or self.last_walk is None or time.monotonic() - self.last_walk >= walk_interval
        )

    def _observe(self, observed: Observed) -> None:
        self.observed = observed
        self.generation += 1

    def _walk_blocking(self) -> tuple[Observed, refresh.Plan | None, refresh.Snapshot | None]:
        reading = self.reader(self.host)
        observed = Observed(
            interfaces=reading.interfaces,
            groups=list(reading.groups),
            failed_manufacturers=set(reading.failed_manufacturers),
            conditions=list(reading.conditions),
        )
        if reading.interfaces is None:
            return observed, None, None
        plan = refresh.plan(self.host, reading.interfaces)
        snap = refresh.snapshot(plan)
        # Judge every link again from the snapshot's moment, so a change between the walk's read and the
        # snapshot cannot hide until the next walk.
        observed.interfaces = refresh.apply(reading.interfaces, refresh.judge(plan, None, snap))
        return observed, plan, snap

    def _refresh_blocking(
        self, plan: refresh.Plan, before: refresh.Snapshot
    ) -> tuple[refresh.Snapshot, refresh.Changes]:
        after = refresh.snapshot(plan)
        if after == before:
            return after, refresh.Changes()
        return after, refresh.judge(plan, before, after)

    def _overdue(self, what: str, exc: hostpoll.Overdue) -> HostError:
        self.metrics.errors.labels(kind="host_timeout").inc()
        log.error(
            "the host read is stuck; failing the pass",
            extra={
                "node": self.node,
                "read": what,
                "stuck_s": round(self._reads.stuck_for(), 1),
                "budget_s": self.read_timeout,
                "detail": str(exc),
            },
        )
        # Stable text: the condition message must not change while the same read stays stuck.
        return HostError(f"the host read did not finish within {self.read_timeout:g}s", READ_TIMEOUT)

    async def walk(self) -> HostError | None:
        """A full host read; returns what went wrong when it failed (the observation then stays as it was)."""
        observed_at = now()
        try:
            observed, plan, snap = await self._reads.read(self._walk_blocking, deadline=self.read_timeout)
        except hostpoll.Overdue as exc:
            return self._overdue("walk", exc)
        except Exception as exc:
            log.exception("reading the host failed", extra={"node": self.node, "root": self.host.root})
            return HostError(f"{type(exc).__name__}: {exc}", INVENTORY_ERROR)
        self.walk_wanted = False
        self.last_walk = time.monotonic()
        self._plan, self._snapshot = plan, snap
        previous = self.observed.interfaces if self.observed is not None else None
        if observed.interfaces is not None:
            observed.interfaces = publish.carry_first_seen(observed.interfaces, previous or [], observed_at)
        self._observe(observed)
        self.performed = PassKind.WALK
        return None

    async def refresh(self) -> HostError | None:
        """Re-read link state only; falls back to a walk when there is nothing planned or a file vanished."""
        plan, before, observed = self._plan, self._snapshot, self.observed
        if plan is None or before is None or observed is None or observed.interfaces is None:
            return await self.walk()
        observed_at = now()
        try:
            after, changes = await self._reads.read(
                self._refresh_blocking, plan, before, deadline=self.read_timeout
            )
        except hostpoll.Overdue as exc:
            return self._overdue("refresh", exc)
        except Exception as exc:
            log.exception("refreshing link state failed", extra={"node": self.node})
            return HostError(f"{type(exc).__name__}: {exc}", INVENTORY_ERROR)
        if after.gone:
            log.info(
                "a watched interface or rdma device is gone; walking the host", extra={"node": self.node}
            )
            return await self.walk()
        self._snapshot = after
        interfaces = refresh.apply(observed.interfaces, changes)
        if interfaces is not observed.interfaces:
            interfaces = publish.carry_first_seen(interfaces, observed.interfaces, observed_at)
            self._observe(
                Observed(interfaces, observed.groups, observed.failed_manufacturers, observed.conditions)
            )
        return None
