"""The agent's settings and what a pass comes to: shared by the agent and the parts it is made of."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from nodefabric_devicemanager.nodeclient import Backoff


@dataclass
class AgentConfig:
    node: str
    root: str = "/"
    # Seconds between link refreshes (port state, operstate).
    interval: float = 60.0
    # Seconds between full walks when no uevent asked for one: the safety net for a missed event.
    walk_interval: float = 600.0
    # Quiet time after a kernel event before the walk, so a burst (128 VFs appearing) is one walk.
    debounce: float = 2.0
    # A burst that never goes quiet still gets a walk this often.
    debounce_max: float = 15.0
    # The host read's budget: a walk or refresh still running after it fails the pass.
    read_timeout: float = 60.0
    # Attempts per pass for conflicts and outages before the pass is declared failed.
    attempts: int = 6
    backoff: Backoff = field(default_factory=Backoff)
    # Follow the object with a watch (the long-running agent); `--once` and unit tests do without.
    watch: bool = True


class Result(enum.StrEnum):
    CREATED = "created"
    UPDATED = "updated"
    UNCHANGED = "unchanged"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Outcome:
    result: Result
    wrote: tuple[str, ...] = ()  # "create", "spec", "status", in order
    # Conditions reported False this pass (an enumeration that failed); the record is still published.
    degraded: tuple[str, ...] = ()
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.result is not Result.FAILED and not self.error
