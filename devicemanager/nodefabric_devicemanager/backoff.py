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


@dataclass(frozen=True, slots=True)
class Backoff:
    """Attempt n (0 the first retry; below 0 counts as 0) waits min(cap, base * 2**n) seconds, jittered
    down to half of that when `jitter`. Raises ValueError for a base or cap that is negative, not finite
    or not a number."""

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

    def ceiling(self, attempt: int) -> float:
        """The longest wait of attempt `attempt`: min(cap, base * 2**attempt), without jitter."""
        if self.base <= 0 or self.cap <= 0:
            return 0.0
        if self.base >= self.cap:
            return float(self.cap)
        # The first exponent whose doubling reaches the cap: past it, every attempt waits the cap.
        enough = math.ceil(math.log2(self.cap) - math.log2(self.base))  # no overflow in cap / base
        exponent = min(max(0, attempt), enough)
        return float(min(self.cap, math.ldexp(self.base, exponent)))

    def delay(self, attempt: int) -> float:
        """Seconds to wait before attempt `attempt` (jittered when `jitter`)."""
        ceiling = self.ceiling(attempt)
        if not self.jitter:
            return ceiling
        return ceiling / 2 + random.uniform(0, ceiling / 2)


__all__ = ["API_BASE_S", "API_CAP_S", "Backoff"]
