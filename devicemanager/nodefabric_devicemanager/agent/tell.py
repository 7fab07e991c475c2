"""What the agent tells people: a log line for each of its conditions that changed, and an Event on the
Devices object for each condition change and each RDMA link that failed or recovered.

A change is remembered as told only once its Event is in the API: one dropped by the spam budget or
refused by the API is posted by a later pass (the budget refilled, the API back) if the condition still
differs from the last Event.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from nodefabric_devicemanager import events
from nodefabric_devicemanager.agent import kube, notices, publish
from nodefabric_devicemanager.agent.hostview import now
from nodefabric_devicemanager.agent.liveobject import LiveObject
from nodefabric_devicemanager.agent.metrics import AgentMetrics
from nodefabric_devicemanager.models import INTERFACES_ENUMERATED, DevicesSpec
from nodefabric_devicemanager.nodeclient import ApiFailure

log = logging.getLogger("nodefabric_devicemanager.agent.core")  # one logger for the agent's passes


class Teller:
    def __init__(self, node: str, obj: LiveObject, metrics: AgentMetrics) -> None:
        self.node = node
        self.obj = obj
        self.metrics = metrics
        self._told: dict[str, tuple[str, str]] = {}  # conditions last logged
        self._posted: dict[str, tuple[str, str]] = {}  # conditions last posted as Events
        # A condition that flaps posts 25 Events at once, then one per 5 minutes (the shared spam filter).
        # spam_clock is read at each decision, not bound now: a test (or a caller) may replace it later.
        self.spam = events.Writer(kube.COMPONENT, clock=lambda: self.spam_clock())  # noqa: PLW0108
        self.spam_clock: Callable[[], float] = time.monotonic  # the budget's clock (seconds)

    def tell(self, reading: publish.ReadingLike) -> tuple[str, ...]:
        """Log each of our conditions that changed since last told (False: why, and what to do); returns
        the conditions reported False."""
        reported = publish.reported_conditions(reading)
        degraded = tuple(c.type for c in reported if c.status == "False")
        for cond in reported:
            if cond.status == "False":
                kind = {INTERFACES_ENUMERATED: "interfaces"}.get(cond.type, "accelerators")
                if self._told.get(cond.type) != (cond.status, cond.reason):
                    self.metrics.errors.labels(kind=kind).inc()
        for notice in notices.notices(self._told, reported):
            log.log(
                notice.level,
                "could not read part of the host; keeping the recorded data"
                if notice.event_type == "Warning"
                else "part of the host is read again",
                extra={
                    "node": self.node,
                    "condition": notice.condition,
                    "reason": notice.reason,
                    "detail": notice.message,
                },
            )
        self._told = notices.remember(self._told, reported)
        return degraded

    async def tell_links(self, before: DevicesSpec, after: DevicesSpec) -> None:
        """A log line and an Event for each RDMA link the written record says failed or recovered."""
        for notice in notices.link_notices(before, after, now()):
            failed = notice.reason == notices.LINK_FAILED
            log.log(
                notice.level,
                "an RDMA link failed" if failed else "an RDMA link recovered",
                extra={
                    "node": self.node,
                    "endpoint": notice.condition.removeprefix("link/"),
                    "detail": notice.message,
                },
            )
            await self._post(notice)

    async def post_notices(self, reading: publish.ReadingLike) -> None:
        """One Event per condition change on the Devices object, remembered once it is posted."""
        if self.obj.live is None:
            return
        for cond in publish.reported_conditions(reading):
            if all([await self._post(notice) for notice in notices.notices(self._posted, [cond])]):
                self._posted = notices.remember(self._posted, [cond])

    async def _post(self, notice: notices.Notice) -> bool:
        """Whether the Event is posted."""
        if not self.spam.admit(self.node):
            self.metrics.events_dropped.inc()
            log.debug(
                "event dropped: this record's Events are over budget",
                extra={"node": self.node, "reason": notice.reason},
            )
            return False
        try:
            await self.obj.api(
                self.obj.client.post_event,
                self.node,
                self.obj.live,
                notice.event_type,
                notice.reason,
                notice.message,
            )
        except ApiFailure as exc:
            log.warning(
                "could not post an event; trying again on the next pass",
                extra={"node": self.node, "reason": notice.reason, "error": str(exc)},
            )
            return False
        self.metrics.events.labels(type=notice.event_type).inc()
        return True
