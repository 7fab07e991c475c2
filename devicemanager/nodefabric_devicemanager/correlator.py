"""Which Events to create, count or drop: client-go's event correlation, as a pure decision.

A record whose link flaps loses and regains `rdma.capable` on every agent pass: the operator has an Event
for each reconcile that changed labels, the agent one for each condition change. Posted as new objects, a
flapping node fills etcd with Events (the API server keeps each for an hour) and pages `kubectl describe`
with the same two lines. client-go's recorder, which every Kubernetes controller uses, bounds this in two
ways, kept here with its defaults:
- an Event identical to one already posted (same object, type, reason and message) raises that Event's
  `count` and `lastTimestamp` instead of creating another;
- a token bucket per involved object (25 at once, then one every 5 minutes) drops the rest.
The operator does both; the agent (whose role may only create Events), the extender and the placement
controller use the token bucket, each through its `events.Writer`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TypeVar

BURST = 25  # client-go's defaultSpamBurst
REFILL_S = 300.0  # client-go's defaultSpamQPS, 1/300
MAX_KEYS = 4096  # client-go's maxLruCacheEntries: what is remembered, per kind, at most
K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True)
class Posted:
    """An Event already in the API: its name, its count, and its first timestamp."""

    name: str
    count: int
    first: str


@dataclass
class _Bucket:
    tokens: float
    at: float


class Correlator:
    """Not thread-safe: the caller holds a lock around each decision."""

    def __init__(self, burst: int = BURST, refill_s: float = REFILL_S, max_keys: int = MAX_KEYS) -> None:
        self.burst, self.refill_s, self.max_keys = burst, refill_s, max_keys
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._posted: OrderedDict[tuple[str, ...], Posted] = OrderedDict()

    def admit(self, source: str, now: float) -> bool:
        """Whether one more Event about `source` (an involved object) may be written at `now` (seconds)."""
        bucket = self._buckets.pop(source, None) or _Bucket(float(self.burst), now)
        bucket.tokens = min(float(self.burst), bucket.tokens + max(0.0, now - bucket.at) / self.refill_s)
        bucket.at = now
        self._remember(self._buckets, source, bucket)
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        return True

    def posted(self, key: tuple[str, ...]) -> Posted | None:
        """The Event already posted with this identity, if it is remembered."""
        return self._posted.get(key)

    def record(self, key: tuple[str, ...], posted: Posted) -> None:
        self._posted.pop(key, None)
        self._remember(self._posted, key, posted)

    def forget(self, key: tuple[str, ...]) -> None:
        self._posted.pop(key, None)

    def _remember(self, table: OrderedDict[K, V], key: K, value: V) -> None:
        table[key] = value  # newest last: the least recently used is forgotten first
        while len(table) > self.max_keys:
            table.popitem(last=False)
