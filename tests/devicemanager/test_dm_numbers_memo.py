"""`numbers.memo`: the remembered answer is the parser's own, for every value, and what is remembered
stays bounded whatever a host hands over."""

from __future__ import annotations

import pytest

from nodefabric_devicemanager import numbers, pci


def test_a_remembered_answer_is_the_parsers_own() -> None:
    calls: list[str | None] = []

    def parse(text: str | None) -> int | None:
        calls.append(text)
        return numbers.parse_opt(text, numbers.MTU)

    cached = numbers.memo(parse)
    for text in ("1500", "9000", None, "", "-1", "0x10", "1500", "9000", None, ""):
        assert cached(text) == numbers.parse_opt(text, numbers.MTU)
    assert calls == ["1500", "9000", None, "", "-1", "0x10"]  # each value parsed once


def test_long_text_is_parsed_every_time_and_never_kept() -> None:
    calls: list[str | None] = []
    cached = numbers.memo(lambda t: calls.append(t) or t)
    long = "1," * numbers._MEMO_CHARS
    assert cached(long) == long and cached(long) == long
    assert calls == [long, long]


def test_what_is_remembered_stays_bounded() -> None:
    calls: list[str | None] = []
    cached = numbers.memo(lambda t: calls.append(t) or t)
    for n in range(10 * numbers._MEMO_ENTRIES):
        assert cached(str(n)) == str(n)
    answers = next(c.cell_contents for c in cached.__closure__ or () if isinstance(c.cell_contents, dict))
    assert 0 < len(answers) <= numbers._MEMO_ENTRIES
    assert len(calls) == 10 * numbers._MEMO_ENTRIES
    assert cached("1") == "1"  # still answers after it was emptied


@pytest.mark.parametrize(
    "raw", ["0x15b3", "0x15B3", "15b3", "0x", None, "", "0x1ffff", "0x15b3\n", "x" * 200]
)
def test_a_memoised_host_parser_answers_as_the_parser_alone(raw: str | None) -> None:
    first, again = pci._pci_id(raw), pci._pci_id(raw)
    assert first == again == pci._hex_id(raw, numbers.PCI_ID, 4)
