"""First publications, logged together: a progress line every EVERY records and one line when they stop.

A record's first publication that only adds keys (a new node, or every node on an install) posts no
Event (events.py) and is told by the record's status; on an install it is also the whole fleet at once.
One INFO line per record there was about 4% of a first sync's CPU under the profiler (a formatted
line, a write and a flush each: 0.43 s over 2,000 records) and thousands of lines that said the same.
So those lines are counted instead: a progress line every EVERY records (`first publications in
progress published=500`), and once none came for QUIET_S (the timer looks every QUIET_S, so at most
twice that), a summary (`labels published for the first time records=2000 seconds=9.1 nodes="n1 n2 n3
n4 n5 and 1995 more"`); a lone new node is then one line naming it, a few seconds late. While they keep
coming, a summary is still written at least every LONGEST_S (a slow trickle of new nodes is named
within a minute). Each record's own line is still written at DEBUG. Everything else a record meets
keeps its own line: a failure (ERROR), a retry or a withheld value (WARNING), a publication that
changes or removes a value (INFO, with an Event), and one that ends a retry or a recorded failure or
whose status write was superseded (reconcile._settle). Only the operator's event loop touches it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

EVERY = 500  # records between two progress lines
QUIET_S = 2.0  # seconds without a first publication before the summary line
LONGEST_S = 60.0  # a summary at least this often while they keep coming (a slow trickle of new nodes)
NAMED = 5  # nodes the summary names


class FirstPublications:
    def __init__(
        self,
        *,
        every: int | None = None,
        quiet_s: float | None = None,
        longest_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # Defaults: the module's values as they are when the operator starts (tests set them).
        self.every = max(1, EVERY if every is None else every)
        self.quiet_s = QUIET_S if quiet_s is None else quiet_s
        self.longest_s = LONGEST_S if longest_s is None else longest_s
        self.clock = clock
        self.count = 0  # since the last summary
        self.names: list[str] = []  # the first NAMED of them
        self.started = 0.0
        self.last = 0.0  # when the newest one was counted
        self._seen_at_check = 0  # the count when the timer last looked
        self._timer: asyncio.TimerHandle | None = None

    def add(self, name: str) -> None:
        """One more record published for the first time (on the event loop)."""
        self.last = self.clock()
        if self.count == 0:
            self.started = self.last
        self.count += 1
        if len(self.names) < NAMED:
            self.names.append(name)
        if self.count % self.every == 0:
            log.info(
                "first publications in progress",
                extra={"published": self.count, "seconds": round(self.last - self.started, 1)},
            )
        if self._timer is None:
            self._seen_at_check = self.count
            self._timer = asyncio.get_running_loop().call_later(self.quiet_s, self._check)

    def _check(self) -> None:
        # One timer per QUIET_S, not one per record: it looks whether any came since it was set.
        self._timer = None
        if self.count != self._seen_at_check and self.clock() - self.started < self.longest_s:
            self._seen_at_check = self.count
            self._timer = asyncio.get_running_loop().call_later(self.quiet_s, self._check)
            return
        self.flush()

    def flush(self) -> None:
        """The summary of what was counted since the last one, now (none when nothing was)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.count == 0:
            return
        more = self.count - len(self.names)
        nodes = " ".join(self.names) + (f" and {more} more" if more > 0 else "")
        log.info(
            "labels published for the first time",
            extra={"records": self.count, "seconds": round(self.last - self.started, 1), "nodes": nodes},
        )
        self.count, self.names = 0, []


class Told:
    """Which publications are counted into the first publications' summary and which keep a line of
    their own: a node named in a "labels not published" ERROR line and not published since keeps its
    own, even when that failure could not be written to its status (where reconcile.quiet_first would
    see it)."""

    def __init__(self) -> None:
        self.first = FirstPublications()
        self.unpublished: set[str] = set()  # named at ERROR, not published since

    def failed(self, name: str) -> None:
        self.unpublished.add(name)

    def forget(self, name: str) -> None:
        self.unpublished.discard(name)

    def counted(self, name: str, quiet_first: bool) -> bool:
        """One reconcile of `name` settled; True when its publication (`quiet_first`: one that may be
        counted) went into the summary rather than a line of its own."""
        told = name in self.unpublished
        self.unpublished.discard(name)
        if quiet_first and not told:
            self.first.add(name)
            return True
        return False

    def flush(self) -> None:
        self.first.flush()
