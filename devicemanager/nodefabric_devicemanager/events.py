"""Kubernetes Events as every nodefabric component writes them: one body, one message cap, one spam filter.

The agent (on its Devices object), the operator (on Devices objects) and the extender and placement
controller (on pods and PlacementGroups) each send through their own client; what they send is shaped
here, and whether they send at all is decided by one `Writer` per component around the client-go spam
filter (correlator.Correlator). A leaf: no API client, nothing above it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from nodefabric_devicemanager.correlator import Correlator

NORMAL, WARNING = "Normal", "Warning"

# The longest message we send, in UTF-8 bytes. events.k8s.io/v1 refuses a note over 1 KiB
# (NoteLengthLimit) and client-go's recorders cut to it; the core/v1 API stores longer ones, but a
# message nobody else's tooling sends only costs etcd and `kubectl describe` space.
MAX_MESSAGE = 1024
_MORE = "..."


def _size(text: str) -> int:
    # A name read from the host may hold a lone surrogate (os.fsdecode's escape of a byte that is not
    # UTF-8): counted as the 3 bytes the API server stores in its place, never an error here.
    return len(text.encode("utf-8", "surrogatepass"))


def cap(message: str, limit: int = MAX_MESSAGE) -> str:
    """`message` at most `limit` UTF-8 bytes, cut on a character boundary with "..." when it was longer."""
    if limit < len(_MORE):
        raise ValueError(f"a message cap must leave room for {_MORE!r}, got {limit}")
    if _size(message) <= limit:
        return message
    room, used = limit - len(_MORE), 0
    for end, ch in enumerate(message):
        used += _size(ch)
        if used > room:
            return message[:end] + _MORE
    raise AssertionError("unreachable: the whole message is over the limit")


def stamp(now: datetime) -> str:
    """An Event timestamp (RFC 3339, whole seconds, UTC as the API server writes it). A naive time is
    taken as UTC (what every caller's clock gives), not as the machine's local time."""
    utc = now.replace(tzinfo=UTC) if now.tzinfo is None else now.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%SZ")


# The API server keeps this much of a generateName (a name of 63 less its 5 random characters).
_PREFIX_CHARS = 58


def _prefix(name: str) -> str:
    """The Event's generateName: `<name>-`, cut to what the API server keeps. The prefix is validated as
    a DNS subdomain with its dash, so a 253-character name (any Node, pod or group may have one) made it
    254 and the Event was refused (422); a cut must not end on a dot ("a.-" starts a label with a dash),
    and "name." is refused too."""
    return (name[: _PREFIX_CHARS - 1].rstrip(".-") or "object") + "-"


def body(
    involved: Mapping[str, Any],
    *,
    namespace: str,
    type_: str,
    reason: str,
    message: str,
    component: str,
    instance: str,
    now: datetime | None = None,
    host: str | None = None,
    action: str | None = None,
) -> dict[str, Any]:
    """A new core/v1 Event about `involved` (its apiVersion, kind, name, and namespace and uid when it
    has them): the message capped, first and last timestamps `now`, count 1."""
    when = stamp(now or datetime.now(UTC))
    name = str(involved.get("name") or "object")
    source: dict[str, str] = {"component": component}
    if host:
        source["host"] = host
    event: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": _prefix(name), "namespace": namespace},
        "involvedObject": {
            k: involved[k] for k in ("apiVersion", "kind", "name", "namespace", "uid") if k in involved
        },
        "type": type_,
        "reason": reason,
        "message": cap(message),
    }
    if action:
        event["action"] = action
    return event | {
        "source": source,
        "reportingComponent": component,
        "reportingInstance": instance,
        "firstTimestamp": when,
        "lastTimestamp": when,
        "count": 1,
    }


class Writer:
    """One component's Events: whether to write (the spam filter, per involved object) and what (body).
    Thread-safe: posts run in worker threads in the operator and the extender."""

    def __init__(
        self,
        component: str,
        *,
        instance: str | None = None,
        spam: Correlator | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.component = component
        self.instance = instance or component
        self.spam = spam or Correlator()  # 25 Events per object at once, then one per 5 minutes
        self.clock = clock
        # Reentrant: a caller that decides more under the same lock (the operator's recorder, which also
        # counts repeats) holds it around admit().
        self.lock = threading.RLock()

    def admit(self, source: str) -> bool:
        """Whether one more Event about `source` (an involved object) may be written now."""
        with self.lock:
            return self.spam.admit(source, self.clock())

    def body(
        self,
        involved: Mapping[str, Any],
        *,
        namespace: str,
        type_: str,
        reason: str,
        message: str,
        now: datetime | None = None,
        host: str | None = None,
        action: str | None = None,
    ) -> dict[str, Any]:
        return body(
            involved,
            namespace=namespace,
            type_=type_,
            reason=reason,
            message=message,
            component=self.component,
            instance=self.instance,
            now=now,
            host=host,
            action=action,
        )
