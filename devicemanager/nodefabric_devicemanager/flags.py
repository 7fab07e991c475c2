"""Parsers of the flag values every command shares (ports, seconds, counts), as argparse `type=` callables.

One home so that every command refuses the same bad value the same way, with argparse's one line naming
the flag and exit 2. A leaf: it imports nothing of ours, so the agent, the device plugin, the DRA driver,
the operator and the extender may all use it under the layer contracts.

Only plain ASCII spellings count: Python's `int()` and `float()` also take `' 80'`, `'8_0'`, `'+80'`,
fullwidth or Arabic-Indic digits, `'inf'` and `'nan'`, none of which anyone means as a port or a timeout.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

_PORT = re.compile(r"[0-9]{1,5}", re.ASCII)
# At most 18 digits: every such count fits an int64, and int() never meets its 4,300-digit limit.
_COUNT = re.compile(r"[0-9]{1,18}", re.ASCII)
# A decimal with an optional fraction and exponent ("30", "0.5", ".5", "1e3"); no inf or nan. A minus
# sign parses, so that "-1" is told the range rather than that it is no number.
_SECONDS = re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?", re.ASCII)


def _port(text: str, lowest: int) -> int:
    if not _PORT.fullmatch(text) or not lowest <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port ({lowest}-65535): {text!r}")
    return int(text)


def port(text: str) -> int:
    """A TCP port 0-65535, where 0 means off (or any free port, as the flag says)."""
    return _port(text, 0)


def port_on(text: str) -> int:
    """A TCP port 1-65535, for a flag whose absence means off."""
    return _port(text, 1)


def count(text: str) -> int:
    """A whole number, 0 or more; the command checks its own bounds (and says which) after parsing."""
    if not _COUNT.fullmatch(text):
        raise argparse.ArgumentTypeError(f"not a whole number (0 or more): {text!r}")
    return int(text)


def seconds(most: float | None = None, *, zero: bool = False) -> Callable[[str], float]:
    """A parser of a duration in seconds: more than 0 (or at least 0 with `zero`), finite, and at most
    `most` when given."""

    def parse(text: str) -> float:
        if not _SECONDS.fullmatch(text):
            raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}")
        value = float(text)  # "1e999" is inf: refused below with the range
        if zero and value == 0:
            return 0.0  # not "-0"
        if math.isfinite(value) and value > 0 and (most is None or value <= most):
            return value
        if most is None:
            raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
        raise argparse.ArgumentTypeError(
            f"must be between 0 and {most:g} seconds{'' if zero else ', not 0'}, got {text!r}"
        )

    return parse
