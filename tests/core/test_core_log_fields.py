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
