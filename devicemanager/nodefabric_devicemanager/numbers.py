"""Numbers read from the host, and read back from the record: one parser, so no reader invents a value.

The kernel prints a number as plain ASCII decimal. Everything else is unknown: a sign, a leading zero,
spaces, an exponent, `1_000`, or a digit that Python's `int()` accepts but the kernel never prints (`²`,
`\u0661`). So is a value outside what the quantity can be, which also keeps every published number inside
int64 and inside the bounds the CRD declares. Unknown is `None`, never 0 and never the raw text; the
caller decides whether that is blank in the record, no hint, or no label.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# fullmatch, not match with `$`: `$` also matches before a trailing newline.
_DECIMAL = re.compile(r"0|[1-9][0-9]*", re.ASCII)


@dataclass(frozen=True, slots=True)
class Quantity:
    """What a number is, and the range a real reading of it can have."""

    what: str
    lo: int
    hi: int
    # The spellings the kernel uses for "no answer" ("-1" for a NUMA node): unknown, and not an error.
    unknown: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        assert 0 <= self.lo <= self.hi < 2**63


# MAX_NUMNODES is 1 << CONFIG_NODES_SHIFT, and the largest shift any architecture allows is 10.
NUMA_NODE = Quantity("NUMA node", 0, 1023, unknown=frozenset({"-1"}))
# net_device.mtu is an unsigned int that dev_set_mtu() refuses above INT_MAX.
MTU = Quantity("MTU", 0, 2**31 - 1)
# TotalVFs and NumVFs are 16-bit fields of the SR-IOV capability.
VF_COUNT = Quantity("VF count", 0, 0xFFFF)
# An RDMA port number is a u8, and port 0 is the switch-management port that is never a ports/ entry.
PORT_NUMBER = Quantity("port number", 1, 0xFF)


class BadNumber(ValueError):
    """A value that is not a reading of the quantity. Its message quotes the value, escaped."""

    def __init__(self, quantity: Quantity, text: str, why: str) -> None:
        shown = text if len(text) <= 32 else f"{text[:32]}... ({len(text)} characters)"
        super().__init__(f"{quantity.what} {shown!r}: {why}")
        self.quantity = quantity
        self.text = text


def parse(text: str, quantity: Quantity) -> int | None:
    """The value, or None for the kernel's own spelling of unknown. Raises BadNumber for anything else."""
    if text in quantity.unknown:
        return None
    # A cap before int(): a 5,000-digit string would cost a quadratic conversion to be refused anyway.
    if len(text) > len(str(quantity.hi)) or not _DECIMAL.fullmatch(text):
        raise BadNumber(quantity, text, "not a plain ASCII decimal number")
    value = int(text)
    if not quantity.lo <= value <= quantity.hi:
        raise BadNumber(quantity, text, f"outside {quantity.lo}..{quantity.hi}")
    return value


def parse_opt(text: str | None, quantity: Quantity) -> int | None:
    """The value, or None when it is absent, blank, unknown or not a reading of the quantity."""
    if not text:
        return None
    try:
        return parse(text, quantity)
    except BadNumber:
        return None


def numa_node(text: str | None) -> int | None:
    """A NUMA node as the record spells it ("" is unknown), the same rule the host reading used."""
    return parse_opt(text, NUMA_NODE)
