"""The pause between retries of a failed request or watch."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with jitter: attempt n waits between half and all of min(cap, base * 2**n),
    so nodes that failed together do not all come back together."""

    base: float = 0.5
    cap: float = 30.0

    def delay(self, attempt: int) -> float:
        ceiling = min(self.cap, self.base * (2 ** min(attempt, 32)))
        return float(ceiling / 2 + random.uniform(0, ceiling / 2))
