"""Leader election on a coordination.k8s.io/v1 Lease: only the holder admits groups.

Every replica serves the webhook; admission needs one writer, since groups are admitted one at a time
against one view of free capacity. The Lease is read and written by the operator's elector
(nodefabric_operator.leader: expiry judged by this replica's own clock from when it saw the record last
change, every write carrying the resourceVersion read, so two replicas never both win); this module adds
what admission needs on top: a holder whose renewals hang or fail stops admitting at the renew deadline,
and `changed` wakes the controller when the lead comes or goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from kubernetes import client

from nodefabric_operator.leader import Elector, LeaseConfig

log = logging.getLogger(__name__)

LEASE_NAME = "nodefabric-placement"
RENEW_DEADLINE = 2 / 3  # of the Lease duration


class LeaderElector:
    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        identity: str,
        *,
        name: str = LEASE_NAME,
        lease_s: int = 15,
        renew_s: float = 5.0,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        self.namespace, self.identity, self.name = namespace, identity, name
        self.lease_s, self.renew_s, self.clock = lease_s, renew_s, clock
        # `monotonic` judges expiry; a test driving `clock` by hand drives both.
        cfg = LeaseConfig(
            namespace, name, identity, duration=lease_s, renew=lease_s * RENEW_DEADLINE, retry=renew_s
        )
        self.elector = Elector(api, cfg, clock, monotonic=monotonic or time.monotonic)
        self._leading = False
        self.renewed = float("-inf")  # when the Lease was last written as ours (`clock`)
        self.changed = asyncio.Event()

    @property
    def leading(self) -> bool:
        """Holding the Lease, renewed within the renew deadline (two thirds of the Lease, as client-go's
        15 s / 10 s): a holder whose renewals hang or fail stops admitting before the Lease runs out and
        another replica may take it."""
        return self._leading and self.clock() - self.renewed < self.lease_s * RENEW_DEADLINE

    @leading.setter
    def leading(self, value: bool) -> None:
        self._leading = value

    def try_once(self) -> bool:
        """One read and at most one write: True while this replica holds the Lease. A refusal (403)
        raises; a lost race or an unreachable API server is False."""
        now = self.clock()
        if not self.elector.try_once():
            return False
        self.renewed = now
        return True

    def release(self) -> None:
        """Give the Lease up on a clean stop, so another replica takes over at once."""
        self.elector.leading = self.leading
        self.elector.release()
        self.leading = False

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                leading = await asyncio.to_thread(self.try_once)
            except Exception as exc:
                log.warning("lease not renewed", extra={"lease": self.name, "error": str(exc)})
                leading = False
            if leading != self.leading:
                self.leading = leading
                log.info(
                    "leading: admitting groups" if leading else "not leading: another replica admits",
                    extra={"lease": f"{self.namespace}/{self.name}", "identity": self.identity},
                )
                self.changed.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.renew_s if leading else self.renew_s / 2)
        await asyncio.to_thread(self.release)
