"""Posts the operator's Events the way client-go's recorder does for a cluster-scoped object.

The Event goes to the `default` namespace with an involvedObject that has no namespace: that is what
`kubectl describe devices n1` searches for (a field selector on the object's name, kind, uid and empty
namespace), and what the API server's validation asks of an Event about a cluster-scoped object. kopf's
own poster writes the operator's namespace into the involvedObject, so describe would never show them.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import kubernetes

from nodefabric_devicemanager import events as shared_events
from nodefabric_devicemanager.correlator import Correlator, Posted
from nodefabric_operator import events, rawcall
from nodefabric_operator.inflight import writing
from nodefabric_operator.metrics import Metrics

log = logging.getLogger(__name__)

NAMESPACE = "default"  # where every Event about a cluster-scoped object lives
EVENTS = "/api/v1/namespaces/{namespace}/events"
EVENT = "/api/v1/namespaces/{namespace}/events/{name}"


def event_body(
    involved: Mapping[str, Any],
    notice: events.Notice,
    instance: str,
    now: datetime,
    action: str = "PublishLabels",
) -> dict[str, Any]:
    # The object is cluster-scoped: whatever namespace a caller's mapping has is not the object's.
    about = {k: v for k, v in involved.items() if k != "namespace"}
    return shared_events.body(
        about,
        namespace=NAMESPACE,
        type_=notice.type,
        reason=notice.reason,
        message=notice.message,
        component=events.COMPONENT,
        instance=instance,
        now=now,
        action=action,
    )


class Recorder:
    """Posts Events as client-go's recorder does (see correlator): a repeat of an Event raises its count,
    and a burst about one object beyond the spam filter's allowance is dropped and counted."""

    def __init__(
        self,
        api: kubernetes.client.ApiClient,
        instance: str,
        metrics: Metrics,
        correlator: Correlator | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.instance = instance
        self.metrics = metrics
        self.writer = shared_events.Writer(events.COMPONENT, instance=instance, spam=correlator, clock=clock)
        self.correlator = self.writer.spam  # besides the spam filter, which Events are posted (to count)
        self._lock = self.writer.lock  # posts run in worker threads

    async def posting(
        self, involved: Mapping[str, Any], notice: events.Notice, action: str = "PublishLabels"
    ) -> None:
        """`post` in a worker thread, which a stopping operator waits for (inflight.writing) and tells to
        send nothing more: no second send after a 401 or a closed connection, no new post after a count
        met a 404. A post still queued for a thread at the stop is never sent, and counted dropped (the
        events metric then agrees with inflight's WARNING, which says how many)."""
        stopping = threading.Event()
        await writing(self.post, involved, notice, action, stopping, stopping=stopping, dropped=self._dropped)

    def _dropped(self) -> None:
        self.metrics.inc(self.metrics.events, "dropped")

    def post(
        self,
        involved: Mapping[str, Any],
        notice: events.Notice,
        action: str = "PublishLabels",
        stopping: threading.Event | None = None,
    ) -> None:
        """One Event, or one more count of the same Event; a failure is logged, never raised: an Event
        is a courtesy, not the work. Once `stopping` is set, no request is sent that was not already."""
        if stopping is not None and stopping.is_set():
            # Its thread took it as the stop came, before a byte was sent: dropped, as a queued one is.
            self._dropped()
            return
        source = str(involved.get("uid") or involved.get("name"))
        key = (source, str(involved.get("name")), notice.type, notice.reason, notice.message)
        with self._lock:
            if not self.writer.admit(source):
                self.metrics.inc(self.metrics.events, "dropped")
                log.debug(
                    "event dropped by the spam filter", extra={"reason": notice.reason, "object": key[1]}
                )
                return
            posted = self.correlator.posted(key)
        now = datetime.now(UTC)
        try:
            if posted is not None and self._count(posted, now, stopping):
                with self._lock:
                    self.correlator.record(key, Posted(posted.name, posted.count + 1, posted.first))
                self.metrics.inc(self.metrics.events, "counted")
                return
            if posted is not None and stopping is not None and stopping.is_set():
                # The count met a 404 as the operator stopped: the new Event would be a write after it.
                self._dropped()
                log.debug("event not posted anew: the operator is stopping", extra={"object": key[1]})
                return
            body = event_body(involved, notice, self.instance, now, action)
            self.metrics.requested("create", "events")
            answer = self._send("POST", EVENTS, {}, body, "application/json", stopping=stopping)
        except Exception as err:
            status = getattr(err, "status", None)
            if status == 401 and stopping is not None and stopping.is_set():
                # Refused for a credential past its expiry, whose refresh and resend the stop withheld:
                # dropped by the stop, as a queued post is, not a failure to alert on (the metric
                # then agrees with inflight's WARNING).
                self._dropped()
                log.debug(
                    "event not sent again after a 401: the operator is stopping", extra={"object": key[1]}
                )
                return
            self.metrics.inc(self.metrics.events, "failed")
            log.warning(
                "could not post event",
                extra={
                    "reason": notice.reason,
                    "object": involved.get("name"),
                    "error": f"HTTP {status}" if status else type(err).__name__,
                },
            )
            return
        self.metrics.inc(self.metrics.events, "created")
        name = _created_name(answer)
        with self._lock:
            if name is None:
                self.correlator.forget(key)
            else:
                self.correlator.record(key, Posted(name, 1, body["firstTimestamp"]))

    def _count(self, posted: Posted, now: datetime, stopping: threading.Event | None) -> bool:
        """Raise an existing Event's count; False when it is gone (expired, deleted): post a new one."""
        patch = {
            "count": posted.count + 1,
            "lastTimestamp": shared_events.stamp(now),
            "firstTimestamp": posted.first,
        }
        self.metrics.requested("patch", "events")
        try:
            self._send("PATCH", EVENT, {"name": posted.name}, patch, rawcall.MERGE_PATCH, stopping=stopping)
        except kubernetes.client.ApiException as err:
            if err.status == 404:
                return False
            raise
        return True

    def _send(
        self,
        method: str,
        path: str,
        params: Mapping[str, str],
        body: Any,
        content_type: str,
        *,
        stopping: threading.Event | None,
    ) -> bytes:
        params = {**params, "namespace": NAMESPACE}
        return rawcall.send(
            self.api, method, path, params, body, content_type=content_type, stopping=stopping
        )


def _created_name(answer: bytes) -> str | None:
    try:
        name = json.loads(answer)["metadata"]["name"]
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return None
    return name if isinstance(name, str) else None
