"""The one capped exponential backoff: attempt n waits base * 2**n seconds, never more than `cap`.

Every retry loop of the product uses it, each with its own timings: the API client's watches and writes
(0.5 s to 30 s, jittered, the defaults), the device plugin's and the DRA driver's socket serving and
kubelet registration (their retry base to 5 s), the placement process's timed-out groups (5 s to 300 s,
counted from attempt 1), and the topology writer's failed passes (up to the resync period).

With `jitter` an attempt waits between half and all of that, so nodes that failed together do not all
come back together. The exponent is bounded before it is raised: an attempt count read back from an
object (or grown over months of failures) may be any size, and 2 ** (a huge count) would take the
process's memory and time, or overflow a float, before the cap applied. A leaf: it imports nothing of
ours, so every layer may use it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

# The API client's timings: a lost API server is asked again within 30 s once it has been gone a while.
API_BASE_S = 0.5
API_CAP_S = 30.0


def _whole(attempt: int | float) -> int:
    """An attempt count as a whole number: a float's whole part (the old backoffs took a count read back
    from JSON as 2.0), NaN as 0 and an infinity as a count past any cap. Raises TypeError for anything
    that is not a number, naming it."""
    if isinstance(attempt, int):
        return attempt
    if not isinstance(attempt, float):
        raise TypeError(f"a backoff attempt must be a number, got {attempt!r}")
    if math.isnan(attempt):
        return 0
    if math.isinf(attempt):
        return 0 if attempt < 0 else 2**31  # past every cap: the exponent is bounded below by `enough`
    return math.floor(attempt)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Attempt n (0 the first retry; below 0 counts as 0, a float as its whole part) waits
    min(cap, base * 2**n) seconds, jittered down to half of that when `jitter`. Raises ValueError for a
    base or cap that is negative, not finite or not a number, TypeError for an attempt that is no number."""

    base: float = API_BASE_S
    cap: float = API_CAP_S
    jitter: bool = True

    def __post_init__(self) -> None:
        for name in ("base", "cap"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"backoff {name} must be a number of seconds, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"backoff {name} must be finite and at least 0 seconds, got {value!r}")

    def ceiling(self, attempt: int | float) -> float:
        """The longest wait of attempt `attempt`: min(cap, base * 2**attempt), without jitter."""
        whole = _whole(attempt)
        if self.base <= 0 or self.cap <= 0:
            return 0.0
        if self.base >= self.cap:
            return float(self.cap)
        # The first exponent whose doubling reaches the cap: past it, every attempt waits the cap.
        enough = math.ceil(math.log2(self.cap) - math.log2(self.base))  # no overflow in cap / base
        exponent = min(max(0, whole), enough)
        try:
            return float(min(self.cap, math.ldexp(self.base, exponent)))
        except OverflowError:  # `enough` is rounded up: past the largest float when the cap is near it
            return float(self.cap)

    def delay(self, attempt: int | float) -> float:
        """Seconds to wait before attempt `attempt` (jittered when `jitter`)."""
        ceiling = self.ceiling(attempt)
        if not self.jitter:
            return ceiling
        return ceiling / 2 + random.uniform(0, ceiling / 2)


__all__ = ["API_BASE_S", "API_CAP_S", "Backoff"]
