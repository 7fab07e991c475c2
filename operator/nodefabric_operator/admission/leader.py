"""Leader election on a coordination.k8s.io/v1 Lease: only the holder admits groups.

Every replica serves the webhook; admission needs one writer, since groups are admitted one at a time
against one view of free capacity. The Lease is taken when it is free or its holder stopped renewing
for `lease_s`; every write carries the resourceVersion read, so two replicas never both win.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)

LEASE_NAME = "nodefabric-placement"
RENEW_DEADLINE = 2 / 3  # of the Lease duration
REQUEST_TIMEOUT = (5, 10)  # connect, read: a hung call must not outlive the renew deadline by much


def _now_text(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(text: object) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


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
    ) -> None:
        self.api: Any = client.CoordinationV1Api(api)  # takes plain dicts as readily as its models
        self.namespace, self.identity, self.name = namespace, identity, name
        self.lease_s, self.renew_s, self.clock = lease_s, renew_s, clock
        self._leading = False
        self.renewed = float("-inf")  # when the Lease was last written as ours (our clock)
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

    def _spec(self, now: float, acquired: str | None, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.lease_s,
            "acquireTime": acquired or _now_text(now),
            "renewTime": _now_text(now),
            "leaseTransitions": transitions,
        }

    def try_once(self) -> bool:
        """One read and at most one write: True while this replica holds the Lease."""
        now = self.clock()
        try:
            resp = self.api.read_namespaced_lease(
                self.name, self.namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
            )
            lease = json.loads(resp.data)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(now, None, 0),
            }
            try:
                self.api.create_namespaced_lease(self.namespace, body, _request_timeout=REQUEST_TIMEOUT)
            except ApiException as exc2:
                if exc2.status == 409:
                    return False
                raise
            self.renewed = now
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        renewed = _parse(spec.get("renewTime")) or 0.0
        duration = spec.get("leaseDurationSeconds")
        duration = duration if isinstance(duration, int) and duration > 0 else self.lease_s
        mine = holder == self.identity
        if not mine and holder and renewed + duration > now:
            return False
        transitions = spec.get("leaseTransitions")
        transitions = transitions if isinstance(transitions, int) else 0
        lease["spec"] = self._spec(
            now, spec.get("acquireTime") if mine else None, transitions if mine else transitions + 1
        )
        try:
            self.api.replace_namespaced_lease(
                self.name, self.namespace, lease, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as exc:
            if exc.status == 409:  # someone else wrote it since we read it
                return False
            raise
        self.renewed = now
        return True

    def release(self) -> None:
        """Give the Lease up on a clean stop, so another replica takes over at once."""
        if not self.leading:
            return
        try:
            resp = self.api.read_namespaced_lease(self.name, self.namespace, _preload_content=False)
            lease = json.loads(resp.data)
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = ""
                self.api.replace_namespaced_lease(self.name, self.namespace, lease)
        except Exception as exc:
            log.warning("could not release the lease", extra={"lease": self.name, "error": str(exc)})
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
