"""A probe's answer, and the two every command has: alive (the loop answers) and ready from a
`(ready, why)` check. No aiohttp here: the agent's core builds these without the server."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Probe:
    """ok (200, else 503), and the body an operator reads from `kubectl describe pod`: a one-line reason
    (a newline is added when it has none), or another content type's document (the operator's JSON)."""

    ok: bool
    reason: str
    content_type: str = "text/plain"


ProbeFn = Callable[[], Probe]


def alive() -> Probe:
    """The liveness of a process whose loop answers at all: the answer itself is the proof."""
    return Probe(True, "ok")


def readiness(check: Callable[[], tuple[bool, str]]) -> ProbeFn:
    """A probe from a `(ready, why)` check (the device plugin's and the DRA driver's `readiness()`)."""

    def probe() -> Probe:
        ok, why = check()
        return Probe(ok, why)

    return probe


__all__ = ["Probe", "ProbeFn", "alive", "readiness"]
