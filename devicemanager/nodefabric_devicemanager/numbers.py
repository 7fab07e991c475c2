"""Numbers read from the host, and read back from the record: one parser, so no reader invents a value.

The kernel prints a number as plain ASCII decimal, or for ids and flags as `0x`-prefixed hex.
Everything else is unknown: a sign, a leading zero, spaces, an exponent, `1_000`, or a digit that
Python's `int()` accepts but the kernel never prints (`²`, `\u0661`). So is a value outside what the
quantity can be, which also keeps every published number inside int64 and inside the bounds the CRD
declares. Unknown is `None`, never 0 and never the raw text; the caller decides whether that is blank in
the record, no hint, or no label.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

# fullmatch, not match with `$`: `$` also matches before a trailing newline.
_DECIMAL = re.compile(r"0|[1-9][0-9]*", re.ASCII)
_HEX = re.compile(r"0x[0-9a-fA-F]+", re.ASCII)
# A kernel cpulist ("0-55,112-167"): bitmap_print_to_pagebuf's `%*pbl`, ranges ascending.
_CPU_LIST = re.compile(r"[0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*", re.ASCII)

_T = TypeVar("_T")
# What `memo` keeps: a host repeats a few short values thousands of times (every VF of a PF has its
# NUMA node, CPU list, ids and port states); longer or rarer text is parsed afresh, so a hostile host
# cannot grow the cache beyond about _MEMO_ENTRIES x _MEMO_CHARS.
_MEMO_ENTRIES = 256
_MEMO_CHARS = 128


def memo(parse: Callable[[str | None], _T]) -> Callable[[str | None], _T]:
    """`parse` (a pure function of one attribute's text) with its answers for short text remembered:
    the same answer, without the regular expressions and int() per VF of a large node."""
    # A plain dict, emptied when full, not functools.lru_cache: a hit is one lookup in this frame, not
    # a call into the cache's wrapper that hashes the argument into a key of its own; a host rarely
    # has more than a handful of distinct values, so the order of eviction buys nothing.
    answers: dict[str | None, _T] = {}

    @functools.wraps(parse)
    def parse_memo(text: str | None) -> _T:
        try:
            return answers[text]
        except KeyError:
            pass
        answer = parse(text)
        if text is None or len(text) <= _MEMO_CHARS:
            if len(answers) >= _MEMO_ENTRIES:
                answers.clear()
            answers[text] = answer
        return answer

    return parse_memo


@dataclass(frozen=True, slots=True)
class Quantity:
    """What a number is, and the range a real reading of it can have."""

    what: str
    lo: int
    hi: int
    # The spellings the kernel uses for "no answer" ("-1" for a NUMA node): unknown, and not an error.
    unknown: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        # Quantities the record publishes as integers stay below 2**63 (see the models' bounds); a u64 that
        # is only ever published as text (an XGMI hive id) may use the whole unsigned range.
        assert 0 <= self.lo <= self.hi < 2**64


# MAX_NUMNODES is 1 << CONFIG_NODES_SHIFT, and the largest shift any architecture allows is 10.
NUMA_NODE = Quantity("NUMA node", 0, 1023, unknown=frozenset({"-1"}))
# net_device.mtu is an unsigned int that dev_set_mtu() refuses above INT_MAX.
MTU = Quantity("MTU", 0, 2**31 - 1)
# TotalVFs and NumVFs are 16-bit fields of the SR-IOV capability; virtfnN is numbered below them.
VF_COUNT = Quantity("VF count", 0, 0xFFFF)
VF_INDEX = Quantity("VF index", 0, 0xFFFF - 1)
# An RDMA port number is a u8, and port 0 is the switch-management port that is never a ports/ entry.
PORT_NUMBER = Quantity("port number", 1, 0xFF)
# A GID table index (`ports/N/gid_attrs/ndevs/<index>`): the table is at most 2**16 entries.
GID_INDEX = Quantity("GID index", 0, 0xFFFF)
# PCI configuration-space ids: 16-bit vendor and device, 24-bit class code.
PCI_ID = Quantity("PCI id", 0, 0xFFFF)
PCI_CLASS = Quantity("PCI class", 0, 0xFFFFFF)
# net_device.flags is an unsigned int, printed "%#x".
NET_FLAGS = Quantity("interface flags", 0, 2**32 - 1)
# A CPU number in a cpulist: NR_CPUS is at most 8192 on every architecture that builds with more.
CPU = Quantity("CPU number", 0, 2**22 - 1)
# KFD topology: node directories are numbered from 0; properties are u32/u64 printed with %u/%llu.
KFD_NODE = Quantity("KFD node", 0, 2**31 - 1)
KFD_PROPERTY = Quantity("KFD property", 0, 2**64 - 1)
XGMI_HIVE_ID = Quantity("XGMI hive id", 0, 2**64 - 1)
# An accelerator's index on one node (a link matrix key, `--free 0-7`): far above any real node, low
# enough that a range of them is a small set.
DEVICE_INDEX = Quantity("device index", 0, 4095)

# Past int64 (19 digits) nothing a JSON input of ours holds is a number.
JSON_DIGITS = 20


def json_int(text: str) -> int:
    """json.loads' parse_int, bounded: a number of more than JSON_DIGITS digits is a ValueError saying
    so (Python's own refusal, at 4,300, names sys.set_int_max_str_digits, no help to who sent it)."""
    digits = len(text.lstrip("-"))
    if digits > JSON_DIGITS:
        raise ValueError(f"a number of {digits:,} digits")
    return int(text)


class BadNumber(ValueError):
    """A value that is not a reading of the quantity. Its message quotes the value, escaped."""

    def __init__(self, quantity: Quantity, text: str, why: str) -> None:
        shown = text if len(text) <= 32 else f"{text[:32]}... ({len(text)} characters)"
        super().__init__(f"{quantity.what} {shown!r}: {why}")
        self.quantity = quantity
        self.text = text


def _checked(quantity: Quantity, text: str, value: int) -> int:
    if not quantity.lo <= value <= quantity.hi:
        raise BadNumber(quantity, text, f"outside {quantity.lo}..{quantity.hi}")
    return value


def parse(text: str, quantity: Quantity) -> int | None:
    """The value, or None for the kernel's own spelling of unknown. Raises BadNumber for anything else."""
    if text in quantity.unknown:
        return None
    if not _DECIMAL.fullmatch(text):
        raise BadNumber(quantity, text, "not a plain ASCII decimal number")
    # Refused by its length before int(): a 5,000-digit number would cost a quadratic conversion.
    if len(text) > len(str(quantity.hi)):
        raise BadNumber(quantity, text, f"outside {quantity.lo}..{quantity.hi}")
    return _checked(quantity, text, int(text))


def parse_hex(text: str, quantity: Quantity) -> int:
    """A `0x`-prefixed hex reading ("0x15b3", "0x1003"), as the kernel prints ids and flags."""
    if len(text) > 2 + len(f"{quantity.hi:x}") + 8 or not _HEX.fullmatch(text):
        # Leading zeros are the kernel's own padding ("0x020000"), so a little slack beyond the width.
        raise BadNumber(quantity, text, "not a 0x-prefixed ASCII hex number")
    return _checked(quantity, text, int(text, 16))


def parse_opt(text: str | None, quantity: Quantity) -> int | None:
    """The value, or None when it is absent, blank, unknown or not a reading of the quantity."""
    return _opt(parse, text, quantity)


def parse_hex_opt(text: str | None, quantity: Quantity) -> int | None:
    return _opt(parse_hex, text, quantity)


def _opt(parser: Callable[[str, Quantity], int | None], text: str | None, quantity: Quantity) -> int | None:
    if not text:
        return None
    try:
        return parser(text, quantity)
    except BadNumber:
        return None


@memo
def numa_node(text: str | None) -> int | None:
    """A NUMA node as the record spells it ("" is unknown), the same rule the host reading used."""
    return parse_opt(text, NUMA_NODE)


@memo
def cpu_list(text: str | None) -> str | None:
    """A kernel cpulist ("0-55,112-167") when it is one: ascending, plain decimals, every CPU number in
    range. Returned as read (it is already the canonical form); None for anything else."""
    if not text or len(text) > 64 * 1024 or not _CPU_LIST.fullmatch(text):
        return None
    last = -1
    for part in text.split(","):
        lo_text, _, hi_text = part.partition("-")
        lo = parse_opt(lo_text, CPU)
        hi = parse_opt(hi_text, CPU) if hi_text else lo
        if lo is None or hi is None or not last < lo <= hi:
            return None
        last = hi
    return text
