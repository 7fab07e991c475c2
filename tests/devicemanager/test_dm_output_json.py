"""The fast JSON path of `-o json` writes exactly what json.dumps(indent=2) writes, for every plain document
(a model's wire form): text that pydantic_core would write differently takes json's own path."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from nodefabric_devicemanager.commands import output

ASCII = "".join(chr(i) for i in range(128))

DOCUMENTS: list[Any] = [
    {},
    [],
    "",
    0,
    None,
    {"empty": [], "nothing": {}, "nested": [[], [{}], {"a": [1, {"b": []}]}]},
    {"n": None, "t": True, "f": False, "neg": -5, "i64": 2**63 - 1, "u64": 2**64 - 1, "big": 2**70},
    {"every ascii but DEL": ASCII.replace("\x7f", "")},
    {"DEL": "del\x7fx"},
    {"every ascii": ASCII},
    {"latin": "caf\u00e9", "cjk": "\u7f51", "astral": "\U0001f600"},
    {"not utf-8": "bad\udcffbyte"},
    {"caf\u00e9": "a key that is not ASCII"},
    {"quote": 'q"uote', "backslash": "back\\slash", "slash": "a/b", "esc": "\x1b[31m"},
    [{"name": f"ens{i}f0", "vfs": list(range(i))} for i in range(20)],
]


@pytest.mark.parametrize("doc", DOCUMENTS, ids=range(len(DOCUMENTS)))
def test_json_text_is_json_dumps_byte_for_byte(doc: Any) -> None:
    assert output.json_text(doc) == json.dumps(doc, indent=2)


@pytest.mark.parametrize("plain", [True, False])
def test_document_writes_one_newline_terminated_json(plain: bool) -> None:
    out = io.StringIO()
    output.document({"a": ["b", 1]}, "json", out, plain=plain)
    assert out.getvalue() == '{\n  "a": [\n    "b",\n    1\n  ]\n}\n'


def test_a_float_keeps_json_s_spelling_by_default() -> None:
    out = io.StringIO()
    output.document({"x": 1e16, "y": 1e-7, "z": float("nan")}, "json", out)
    assert out.getvalue() == json.dumps({"x": 1e16, "y": 1e-7, "z": float("nan")}, indent=2) + "\n"


def test_what_neither_encoder_can_write_is_json_s_error() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        output.json_text({"x": object()})
