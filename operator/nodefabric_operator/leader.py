"""Leader election on a coordination.k8s.io Lease, as client-go's leaderelection does it, so that more
than one operator replica may run: one publishes, the others wait to take over.

kopf's own peering is not leader election: replicas of the same priority all pause (every replica of a
Deployment has the same arguments), so it suits a developer's operator pausing the cluster's, not a
standby. A Lease needs no CRD of ours, and `kubectl get lease -n <ns> nodefabric-operator` shows who leads.

The holder renews every `retry` seconds; one that could not renew for `renew` seconds stops publishing
and exits (the pod restarts as a standby), before its lease expires after `duration` seconds and another
replica may take it. Expiry is judged by each replica's own clock, from when it saw the record last
change (as client-go does), never from the holder's renewTime: clocks of different machines may differ
by any amount, and a Lease edited by hand may say anything. A replica that stops cleanly releases the
lease, so a standby takes over within `retry` seconds rather than `duration`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kubernetes
import urllib3

from nodefabric_devicemanager.backoff import Backoff
from nodefabric_operator import rawcall, sinks
from nodefabric_operator.view import version

log = logging.getLogger(__name__)

# connect, read: a hung Lease call must not hold the elector past its renew deadline for long
REQUEST_TIMEOUT = (5.0, 10.0)
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
LEASE = LEASES + "/{name}"
# The longest wait between two tries while the Lease's namespace does not exist: it takes a person to
# create it, and each try is two requests that cannot succeed until then.
ABSENT_CAP = 300.0


def absent_delays(retry: float) -> Iterator[float]:
    """The waits between tries while the namespace is missing: `retry`, doubling up to ABSENT_CAP."""
    backoff = Backoff(base=max(retry, 0.1), cap=max(ABSENT_CAP, retry), jitter=False)
    return (backoff.ceiling(n) for n in itertools.count())


@dataclass(frozen=True)
class LeaseConfig:
    namespace: str
    name: str
    identity: str
    duration: float = 15.0
    renew: float = 10.0
    retry: float = 2.0


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def takeable(spec: dict[str, Any], identity: str, *, seen: float, now: float) -> bool:
    """Whether `identity` may hold a lease with this spec now: it holds it, nobody does, or the holder
    has not changed the record for its duration (one that is no number of seconds is expired).

    `seen` (when this replica first read the record as it is) and `now` are of this replica's own
    monotonic clock, as client-go's observedTime: the holder's renewTime is of another machine's clock,
    and read against ours a lease renewed from a clock running ahead (or edited by hand to a time years
    away) would never expire, and one renewed from a clock running behind would be taken from a live
    holder."""
    holder = spec.get("holderIdentity") or ""
    if not holder or holder == identity:
        return True
    duration = spec.get("leaseDurationSeconds")
    if not isinstance(duration, int) or isinstance(duration, bool):
        return True
    return now > seen + duration


class Elector:
    def __init__(
        self,
        api: kubernetes.client.ApiClient,
        cfg: LeaseConfig,
        clock: Callable[[], float] = time.time,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.cfg = cfg
        self.clock = clock  # the stamps written (renewTime, acquireTime)
        self.monotonic = monotonic  # this replica's own clock, which expiry is judged by
        # The record last read and when (self.monotonic) it was first read so: a holder that stops
        # renewing leaves it unchanged.
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self.leading = False
        # Renewals run in worker threads: once released, no renewal still in flight may take it back.
        self._lock = threading.Lock()
        self._released = False
        # Why the last try could not create the Lease when its namespace does not exist (or is being
        # deleted); None otherwise. Read by acquire and hold to say it and back off.
        self.absent: str | None = None

    def _body(self, current: dict[str, Any] | None, now: float) -> dict[str, Any]:
        spec = dict((current or {}).get("spec") or {})
        changed = spec.get("holderIdentity") != self.cfg.identity
        spec.update(
            holderIdentity=self.cfg.identity,
            leaseDurationSeconds=max(1, round(self.cfg.duration)),
            renewTime=_stamp(now),
        )
        if changed:
            spec["acquireTime"] = _stamp(now)
            spec["leaseTransitions"] = _count(spec.get("leaseTransitions")) + (1 if current else 0)
        meta: dict[str, Any] = {"name": self.cfg.name, "namespace": self.cfg.namespace}
        if current is not None:
            meta["resourceVersion"] = version(current)
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    def _send(self, method: str, path: str, body: dict[str, Any] | None = None) -> bytes:
        """One Lease request through rawcall: every answer, a refusal's too, read up to wire.MAX_ANSWER
        (an endless body is refused, an OSError: a failed try, the connection closed unread; the
        generated calls read a refusal's body whole before raising it), within REQUEST_TIMEOUT."""
        at = {"ns": self.cfg.namespace, "name": self.cfg.name}
        return rawcall.send(self.api, method, path, at, body, timeout=REQUEST_TIMEOUT)

    def _replace(self, body: dict[str, Any]) -> None:
        self._send("PUT", LEASE, body)

    def _read(self) -> dict[str, Any] | None:
        try:
            raw = self._send("GET", LEASE)
        except kubernetes.client.ApiException as err:
            if sinks.status_of(err) == 404:
                return None
            raise
        return _lease(sinks._decoded(raw))

    def try_once(self) -> bool:
        """One attempt to acquire or renew; True while this replica holds the lease. Transient failures
        and a lost race (409) are False, and so is a create refused for its namespace (missing, or
        being deleted: `absent` says which); any other refusal (403) raises."""
        with self._lock:
            if self._released:
                return False
            return self._try_once()

    def _try_once(self) -> bool:
        self.absent = None
        try:
            current = self._read()
            now = self.clock()
            if current is not None and not self._takeable(dict(current["spec"])):
                return False
            body = self._body(current, now)
            if current is None:
                self._create(body)
            else:
                self._replace(body)
            return True
        except kubernetes.client.ApiException as err:
            status = sinks.status_of(err)
            if status in (400, 401, 403, 422) and self.absent is None:
                raise  # refused as asked: asking again changes nothing (a namespace being deleted will)
            return False  # a lost race (409), an overloaded or unreachable API server: try again
        except (urllib3.exceptions.HTTPError, OSError, sinks.SinkError):
            return False  # sinks.SinkError: an answer that is no lease (a proxy's page), as a broken one

    def _create(self, body: dict[str, Any]) -> None:
        """The Lease created; a refusal for its namespace (404 naming it, or 403 NamespaceTerminating)
        noted in `absent`, then raised as any failed try."""
        try:
            self._send("POST", LEASES, body)
        except kubernetes.client.ApiException as err:
            ns = self.cfg.namespace
            if sinks.missing_namespace(err, ns):
                self.absent = f"namespace {ns} does not exist"
            elif sinks.terminating_namespace(err):
                self.absent = f"namespace {ns} is being deleted"
            raise

    def _takeable(self, spec: dict[str, Any]) -> bool:
        record = tuple(
            repr(spec.get(k))
            for k in (
                "holderIdentity",
                "renewTime",
                "acquireTime",
                "leaseDurationSeconds",
                "leaseTransitions",
            )
        )
        seen = self.monotonic()
        if record != self._observed:
            self._observed, self._observed_at = record, seen
        return takeable(spec, self.cfg.identity, seen=self._observed_at, now=seen)

    async def acquire(self, stopping: Callable[[], bool]) -> bool:
        """Wait until this replica holds the lease (True) or `stopping()` says to give up (False). A
        Lease whose namespace does not exist is said once, as an ERROR (no replica can lead until someone
        creates it), and tried again on a growing backoff, not every `retry` seconds."""
        where = {"lease": f"{self.cfg.namespace}/{self.cfg.name}", "identity": self.cfg.identity}
        waiting_logged = said = False  # said: the namespace's ERROR line, once
        backoff: Iterator[float] | None = None  # while the namespace is missing
        while not stopping():
            if await asyncio.to_thread(self.try_once):
                self.leading = True
                if said:
                    log.info("the lease's namespace exists now", extra=where)
                log.info("leading", extra=where)
                return True
            if self.absent is None:
                backoff = None
                if not waiting_logged:
                    log.info("waiting to lead", extra=where)
                    waiting_logged = True
                await asyncio.sleep(self.cfg.retry)
                continue
            backoff = backoff or absent_delays(self.cfg.retry)
            if not said:
                said = True
                log.error(
                    "cannot take the lease: its namespace is missing, nothing is published until it exists",
                    extra={
                        **where,
                        "error": self.absent,
                        "fix": "create it, or run with --namespace naming one",
                    },
                )
            delay = next(backoff)
            log.debug("the lease's namespace is still missing", extra={**where, "retry_in_s": delay})
            await asyncio.sleep(delay)
        return False

    async def hold(self) -> None:
        """Renew every `retry` seconds; return when it could not be renewed for `renew` seconds, or at
        once when a renewal is refused (403), saying why."""
        last = time.monotonic()
        while True:
            await asyncio.sleep(self.cfg.retry)
            try:
                renewed = await asyncio.to_thread(self.try_once)
            except kubernetes.client.ApiException as err:
                # Refused (RBAC taken away): asking again changes nothing. Said here, since the caller
                # only sees that the holding ended.
                self._lost(refusal(err))
                return
            if renewed:
                last = time.monotonic()
            elif time.monotonic() - last >= self.cfg.renew:
                self._lost(
                    f"not renewed for {self.cfg.renew:g} s" + (f": {self.absent}" if self.absent else "")
                )
                return

    def _lost(self, why: str) -> None:
        self.leading = False
        log.error(
            "lost the lease, stopping",
            extra={
                "lease": f"{self.cfg.namespace}/{self.cfg.name}",
                "identity": self.cfg.identity,
                "error": why,
            },
        )

    def release(self) -> None:
        """Give the lease up (holder cleared, one-second duration) so a standby need not wait it out; no
        later renewal takes it back."""
        with self._lock:
            self._released = True
            if not self.leading:
                return
            self.leading = False
            self._give_up()

    def _give_up(self) -> None:
        try:
            current = self._read()
            if current is None or current["spec"].get("holderIdentity") != self.cfg.identity:
                return
            body = self._body(current, self.clock())
            body["spec"].update(holderIdentity=None, leaseDurationSeconds=1)
            self._replace(body)
            log.info("lease released", extra={"lease": f"{self.cfg.namespace}/{self.cfg.name}"})
        except (
            kubernetes.client.ApiException,
            urllib3.exceptions.HTTPError,
            OSError,
            sinks.SinkError,
        ) as err:
            log.warning("could not release the lease", extra={"error": type(err).__name__})


def _lease(obj: dict[str, Any]) -> dict[str, Any]:
    """A Lease as read, its spec an object ({} when absent) and its resourceVersion text; a SinkError
    for anything else (what the API server never sends: a broken proxy's answer), so a try fails rather
    than writing over a lease it could not read (no resourceVersion: an unconditional write)."""
    spec = obj.get("spec")
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise sinks.SinkError(f"the lease read has a spec that is a {type(spec).__name__}, not an object")
    if not isinstance(obj.get("metadata"), dict) or not isinstance(version(obj), str):
        raise sinks.SinkError("the lease read has no resourceVersion")
    return {**obj, "spec": spec}


def _count(value: Any) -> int:
    """leaseTransitions as a count: anything but a whole number (someone's edit) counts from 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


SAID_CHARS = 200  # of the API server's message quoted in a refusal: the whole line is cut at 300 (first_line)


def refusal(err: kubernetes.client.ApiException) -> str:
    """A refused Lease request as one line: the status, and the API server's own message, which says what
    the role lacks (RBAC names the verb, resource and namespace), cut to SAID_CHARS characters with
    control characters (a newline, a terminal escape) dropped: it is the server's text, quoted in ours."""
    said = f"HTTP {err.status} {err.reason or ''}".strip()
    message = rawcall.status_body(err).get("message")
    if not isinstance(message, str):
        return said
    shown = "".join(c if c.isprintable() else " " for c in message[: SAID_CHARS * 2])
    shown = " ".join(shown.split())
    if len(shown) > SAID_CHARS:
        shown = shown[: SAID_CHARS - 3] + "..."
    return f"{said}: {shown}" if shown else said
