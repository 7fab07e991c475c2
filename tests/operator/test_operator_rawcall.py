"""rawcall's answer reader: what the generated custom-object calls return (a JSON object), and a clear
ValueError for any other answer, so no caller reads a list or a string as an object."""

from __future__ import annotations

import pytest

from nodefabric_operator import rawcall


def test_an_object_answer_is_read_as_a_dict() -> None:
    assert rawcall.json_object(b'{"metadata": {"name": "gpu-0"}, "status": {}}') == {
        "metadata": {"name": "gpu-0"},
        "status": {},
    }


@pytest.mark.parametrize(
    ("answer", "said"),
    [(b"[]", "a list, not an object"), (b'"ok"', "a str, not an object"), (b"null", "a NoneType")],
)
def test_an_answer_that_is_not_an_object_is_refused_by_name(answer: bytes, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        rawcall.json_object(answer)


@pytest.mark.parametrize("answer", [b"", b"<html>502 Bad Gateway</html>", b"\xff\xfe", b'{"a": '])
def test_garbage_is_a_value_error(answer: bytes) -> None:
    with pytest.raises(ValueError):
        rawcall.json_object(answer)
