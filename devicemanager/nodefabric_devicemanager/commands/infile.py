"""The file a command is handed (`labels -f`, `slices -f`, `pick --links`), read as a hostile user may
hand it: every way it can fail is one BadInput naming the file, never a hang, a traceback or the whole
of /dev/zero in memory.

- A FIFO with no writer must not hang the open: the open is non-blocking, then the read blocks as a
  pipe's does (`-f <(kubectl get devices n -o yaml)` works; a FIFO nobody writes reads as empty).
- What is read is capped at MAX_BYTES (a device node, a runaway pipe); beyond it is refused whole.
- Standard input closed (`<&-`) is said to be closed; a terminal is read to its end (Ctrl-D), which the
  command says it waits for; a directory is said to be one.
- The text is UTF-8 (a leading BOM, as some editors write, is dropped); anything else is refused.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from collections.abc import Callable
from typing import BinaryIO

MAX_BYTES = 16 * 1024 * 1024  # a record of 1,024 VFs is 0.8 MiB as indented JSON, 0.6 MiB as YAML
_CHUNK = 1024 * 1024


class BadInput(ValueError):
    """The file cannot be read as the command's input; the message says why, the caller names the file
    ("cannot read PATH: ...")."""


def read_bytes(path: str, limit: int = MAX_BYTES) -> bytes:
    """The file's bytes ("-": standard input's), at most `limit` of them."""
    if path == "-":
        stream = sys.stdin
        if stream is None:  # started with standard input closed: Python gives it no sys.stdin
            raise BadInput("standard input is closed")
        buffer: BinaryIO | None = getattr(stream, "buffer", None)
        if stream.isatty():  # a person at a terminal, who may not know the command waits for them
            sys.stderr.write("reading the input from the terminal; end it with Ctrl-D\n")
        try:
            if buffer is None:  # a text stream put in its place (a caller's io.StringIO)

                def text(size: int) -> bytes:
                    return stream.read(size).encode("utf-8", "surrogateescape")

                return _capped(text, limit, short_read_ends=True)
            return _capped(buffer.read, limit, short_read_ends=True)
        except OSError as err:
            raise BadInput(f"standard input: {err.strerror or err}") from None
    try:
        # Non-blocking: opening a FIFO for reading otherwise waits for a writer, for ever if none comes.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise BadInput(err.strerror or str(err)) from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise BadInput("it is a directory")
        # From here a read waits as a pipe's does; a FIFO with no writer reads as empty at once.
        os.set_blocking(fd, True)

        def read(size: int) -> bytes:
            return os.read(fd, size)

        try:
            data = _capped(read, limit)
        except OSError as err:
            raise BadInput(err.strerror or str(err)) from None
        if not data and stat.S_ISFIFO(mode):
            raise BadInput("it is a FIFO that gave nothing (no writer)")
        return data
    finally:
        os.close(fd)


def _capped(read: Callable[[int], bytes | None], limit: int, *, short_read_ends: bool = False) -> bytes:
    """At most `limit` bytes from `read`, BadInput beyond. `short_read_ends`: `read` is a buffered
    stream's, which returns less than asked only at the end: one Ctrl-D ends a terminal's input (asked
    again, a terminal would wait for a second)."""
    chunks: list[bytes] = []
    total = 0
    while True:
        want = min(_CHUNK, limit + 1 - total)
        chunk = read(want)
        if chunk is None:  # standard input left non-blocking by whoever started us, with nothing yet
            raise OSError(errno.EAGAIN, "it is non-blocking and had nothing to read")
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            raise BadInput(f"it is larger than {limit:,} bytes")
        if short_read_ends and len(chunk) < want:
            return b"".join(chunks)


def read_text(path: str, limit: int = MAX_BYTES) -> str:
    """The file's text: UTF-8, a BOM dropped; BadInput for bytes that are not UTF-8 or for no text."""
    data = read_bytes(path, limit)
    bom = 3 if data.startswith(b"\xef\xbb\xbf") else 0
    try:
        text = data[bom:].decode("utf-8")
    except UnicodeDecodeError as err:
        at = bom + err.start
        raise BadInput(f"it is not UTF-8 text (can't decode byte 0x{data[at]:02x} at offset {at})") from None
    if not text.strip():
        raise BadInput("it is empty" if not text else "it holds only whitespace")
    return text
