"""No log call can raise: a field passed as `extra=` that is also a LogRecord attribute (`name`, `msg`,
`args`, ...) makes `logging` raise KeyError in the very call meant to report a failure, so the error path
it sits on dies with it (the agent's watch did, on every reconnect). Checked over every literal `extra=`
of the shipped code, since such a path runs only when something already went wrong."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


def test_no_extra_field_overwrites_a_log_record_attribute() -> None:
    clashes = []
    for folder in ("devicemanager", "deviceplugin", "operator", "hack"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.keyword) and node.arg == "extra" and isinstance(node.value, ast.Dict):
                    clashes += [
                        f"{path.relative_to(ROOT)}:{node.value.lineno}: {key.value!r}"
                        for key in node.value.keys
                        if isinstance(key, ast.Constant) and key.value in RESERVED
                    ]
    assert not clashes, clashes


def test_an_unprintable_field_value_cannot_forge_a_line_or_reach_the_terminal() -> None:
    """A value carrying an ESC sequence, a newline and a bidi override (a hostile host's interface name,
    a --root typed by hand) is written quoted and escaped: one line, no control character in it."""
    from nodefabric_devicemanager import logs

    record = logging.LogRecord("nodefabric", logging.WARNING, "", 0, "read failed", (), None)
    record.root = "/tmp/e\x1b[31m\nforged"
    record.name_rtl = "eth\u202e0"
    record.plain = "eth0"
    line = logs.KeyValueFormatter().format(record)
    assert "\n" not in line and "\x1b" not in line and "\u202e" not in line
    assert 'root="/tmp/e\\u001b[31m\\nforged"' in line
    assert 'name_rtl="eth\\u202e0"' in line
    assert line.endswith(" plain=eth0")  # a printable value without space, = or quote stays bare
