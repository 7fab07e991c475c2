"""The one parser for numbers read from the host: what a real reading is, and everything that is not."""

from __future__ import annotations

import pytest

from nodefabric_devicemanager import numbers
from nodefabric_devicemanager.numbers import MTU, NUMA_NODE, PORT_NUMBER, VF_COUNT, BadNumber


@pytest.mark.parametrize(
    ("text", "quantity", "value"),
    [
        ("0", NUMA_NODE, 0),
        ("1023", NUMA_NODE, 1023),
        ("-1", NUMA_NODE, None),  # the kernel's own "no answer"
        ("9000", MTU, 9000),
        ("65536", MTU, 65536),  # lo
        ("2147483647", MTU, 2**31 - 1),
        ("128", VF_COUNT, 128),
        ("1", PORT_NUMBER, 1),
    ],
)
def test_real_readings(text, quantity, value):
    assert numbers.parse(text, quantity) == value


@pytest.mark.parametrize(
    ("text", "quantity"),
    [
        ("²", NUMA_NODE),  # str.isdigit() and int() both accept it
        ("\u0661", NUMA_NODE),  # Arabic-Indic one: int() reads 1
        ("01", NUMA_NODE),
        ("abc", NUMA_NODE),
        ("1024", NUMA_NODE),
        ("-2", NUMA_NODE),
        ("1" * 23, NUMA_NODE),  # would overflow int64
        ("-9000", MTU),
        ("1e23", MTU),
        ("2147483648", MTU),
        ("1_000", MTU),
        (" 9000", MTU),
        ("9000\n", MTU),  # a trailing newline that `$` would have let through
        ("9000\x00", MTU),
        ("+1", VF_COUNT),
        ("65536", VF_COUNT),
        ("0", PORT_NUMBER),
        ("256", PORT_NUMBER),
        ("", MTU),
        ("9" * 5000, MTU),  # refused before int() would pay for the conversion
    ],
)
def test_anything_else_is_refused_with_the_quantity_named(text, quantity):
    with pytest.raises(BadNumber) as err:
        numbers.parse(text, quantity)
    assert quantity.what in str(err.value)
    assert len(str(err.value)) < 120, "the message quotes a huge value only in part"
    assert numbers.parse_opt(text, quantity) is None


def test_absent_and_blank_are_unknown():
    assert numbers.parse_opt(None, MTU) is None
    assert numbers.numa_node("") is None
    assert numbers.numa_node("-1") is None
    assert numbers.numa_node("3") == 3


@pytest.mark.parametrize(
    ("text", "quantity", "value"),
    [
        ("0x15b3", numbers.PCI_ID, 0x15B3),
        ("0x15B3", numbers.PCI_ID, 0x15B3),
        ("0x020000", numbers.PCI_CLASS, 0x020000),  # the kernel pads the class to six digits
        ("0x1003", numbers.NET_FLAGS, 0x1003),
    ],
)
def test_hex_readings(text, quantity, value):
    assert numbers.parse_hex(text, quantity) == value


@pytest.mark.parametrize(
    ("text", "quantity"),
    [
        ("15b3", numbers.PCI_ID),  # the kernel always prints the prefix
        ("0x", numbers.PCI_ID),
        ("0x10000", numbers.PCI_ID),  # beyond 16 bits
        ("-0x1", numbers.PCI_ID),
        ("0x15b3\n", numbers.PCI_ID),
        ("0x1_0", numbers.NET_FLAGS),
        ("0b101", numbers.NET_FLAGS),  # int(x, 0) would accept it
        ("0x" + "f" * 5000, numbers.NET_FLAGS),
        ("0x\u0661", numbers.PCI_ID),
    ],
)
def test_anything_else_is_not_a_hex_reading(text, quantity):
    with pytest.raises(BadNumber):
        numbers.parse_hex(text, quantity)
    assert numbers.parse_hex_opt(text, quantity) is None


@pytest.mark.parametrize("text", ["0", "0-55,112-167", "3,5,7-9", "0-4194303"])
def test_cpu_lists_the_kernel_prints(text):
    assert numbers.cpu_list(text) == text


@pytest.mark.parametrize(
    "text",
    ["", "abc", "0-55,", ",1", "5-3", "3,1", "1,1", "0-4194304", "1 ,2", "0-55\n", "\u0661", "01", "-1"],
)
def test_anything_else_is_no_cpu_list(text):
    assert numbers.cpu_list(text) is None


def test_a_hive_id_may_use_all_64_bits_because_it_is_published_as_text():
    assert numbers.parse(str(2**64 - 1), numbers.XGMI_HIVE_ID) == 2**64 - 1
    with pytest.raises(BadNumber):
        numbers.parse(str(2**64), numbers.XGMI_HIVE_ID)


def test_memo_answers_as_the_parser_does_and_keeps_only_short_text() -> None:
    calls: list[str | None] = []

    def parse(text: str | None) -> int | None:
        calls.append(text)
        return numbers.parse_opt(text, numbers.NUMA_NODE)

    cached = numbers.memo(parse)
    long = "1" * (numbers._MEMO_CHARS + 1)
    for text in ("0", "-1", "", None, "x", "1023", "1024", long):
        assert cached(text) == numbers.parse_opt(text, numbers.NUMA_NODE)
        assert cached(text) == numbers.parse_opt(text, numbers.NUMA_NODE)
    # Short text (None included) is parsed once; longer text every time, so it is never kept.
    assert calls.count("0") == 1 and calls.count(None) == 1
    assert calls.count(long) == 2
    # A host with more distinct values than the cache holds still gets the parser's answer for each.
    for n in range(3 * numbers._MEMO_ENTRIES):
        assert cached(str(n)) == numbers.parse_opt(str(n), numbers.NUMA_NODE)
    assert numbers.cpu_list("0-3") == "0-3" and numbers.cpu_list("3-0") is None


@pytest.mark.parametrize("text", ["65000", "9" * 40, "9" * 5000])
def test_a_plain_decimal_too_long_for_the_quantity_says_it_is_out_of_range(text):
    """A decimal longer than the quantity's largest is refused by its length (no int() of 5,000 digits)
    and named for what it is: out of range, not "not a plain decimal"."""
    with pytest.raises(numbers.BadNumber, match=r"outside 0\.\.4095$"):
        numbers.parse(text, numbers.DEVICE_INDEX)
