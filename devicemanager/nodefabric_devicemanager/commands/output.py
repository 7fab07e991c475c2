"""How every command prints: one `-o json|yaml|table` option, one table renderer, one escape.

A name printed in a table is the host's text, and the host can put a control character in an interface
name (the kernel refuses only '/', ':' and whitespace): every cell is escaped, so a name can never move
the cursor, recolour the terminal or forge a row. JSON and YAML escape on their own.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any, TextIO

FORMATS = ("json", "yaml", "table")


def add_output(parser: argparse.ArgumentParser, *, default: str, extra: Sequence[str] = ()) -> None:
    """`-o/--output FORMAT`; `extra` keeps a command's older format names working."""
    parser.add_argument(
        "-o",
        "--output",
        choices=[*FORMATS, *extra],
        default=default,
        help=f"output format (default: {default})",
    )


def escape(text: str) -> str:
    """Printable text: anything str.isprintable() refuses (controls, DEL, C1, separators) as \\xNN."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def table(rows: Sequence[Sequence[str]], out: TextIO) -> None:
    """Columns padded to their widest cell, the last left ragged (a reason can be long)."""
    cells = [[escape(c) for c in row] for row in rows]
    if not cells:
        return
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]) - 1)]
    for r in cells:
        padded = [c.ljust(w) for c, w in zip(r, widths, strict=False)]
        out.write("  ".join([*padded, r[-1]]).rstrip() + "\n")


def document(doc: Any, fmt: str, out: TextIO, *, plain: bool = False) -> None:
    """A JSON or YAML document. `plain`: the caller vouches that `doc` holds nothing but dicts with str
    keys, lists, str, int, bool and None (a model's wire form), which lets the JSON take json_text."""
    if fmt == "yaml":
        import yaml  # here, not at the top: every command's start-up paid for it

        yaml.safe_dump(doc, out, sort_keys=False, allow_unicode=True)
    else:
        out.write((json_text(doc) if plain else json.dumps(doc, indent=2)) + "\n")


def json_text(doc: Any) -> str:
    """`json.dumps(doc, indent=2)` of a plain document (see document), byte for byte, five times faster.

    Asked to indent, json encodes in pure Python (32 ms for a node with 1,024 VFs). pydantic_core writes
    the same text, but for what json escapes and it does not (non-ASCII as \\uXXXX, DEL as \\u007f), a
    lone surrogate (a name that is not UTF-8, which it refuses), floats (1e16 against json's 1e+16) and
    sets (a list, where json refuses): a plain document holds neither of the last two, and for the others
    json encodes it."""
    import pydantic_core  # here: only the commands that print a model's wire form pay for the import

    try:
        raw = pydantic_core.to_json(doc, indent=2)
    except (ValueError, TypeError):  # PydanticSerializationError is a ValueError
        return json.dumps(doc, indent=2)
    if raw.isascii() and b"\x7f" not in raw:
        return raw.decode("ascii")
    return json.dumps(doc, indent=2)


MESSAGE_LIMIT = 2000  # characters of one message line; a parser may quote a whole hostile input


def one_line(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """A message as one printable line: a parser's line breaks (pydantic's span several) as spaces, the
    rest escaped, so neither a file's bytes nor a user's argument can forge lines or move the cursor;
    cut at `limit` characters (topo's parser quotes every unexpected column of a 2 MB header)."""
    line = escape(" ".join(text.split()))
    if len(line) <= limit:
        return line
    return f"{line[:limit]}... ({len(line):,} characters in all)"
