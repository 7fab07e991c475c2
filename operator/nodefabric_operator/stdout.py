"""Standard output as a command prints to it, with its failures told apart from every other OSError.

A command's output can fail in ways that are the caller's doing, not a bug: the reader stops early
(`nodefabric inventory | head`), the file it goes to fills its disk, or the shell closed it (`>&-`).
Each is one line (or, for the reader gone, the quiet end a filter has), never a traceback; an OSError
from anything else the command does still shows as the bug it is.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from typing import Any, TextIO


def discard(stream: TextIO) -> None:
    """Point the stream's descriptor at /dev/null, so its buffered text is dropped without an error."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, stream.fileno())
        finally:
            os.close(null)


class OutputFailed(OSError):
    """Writing standard output failed; `errno` and `strerror` are the write's."""


class Output:
    """What `sys.stdout` is while a command runs: the stream itself, or None when the process started
    with it closed, its writes and flushes raising OutputFailed."""

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream
        self.wrote = False  # whether anything was written: only then can a flush have anything to fail
        # The first failure, kept for whoever swallowed it: argparse's --help and --version writes
        # ignore an OSError, and would exit 0 having printed nothing.
        self.failure: OutputFailed | None = None

    def write(self, text: str) -> int:
        self.wrote = True
        with self._failing():
            stream = self._open()
            try:
                written = stream.write(text)
            except UnicodeEncodeError:
                # An output whose encoding cannot say every character (PYTHONIOENCODING=ascii, a Latin-1
                # locale; a table's "└"): those characters written as \uXXXX, as stderr writes them.
                encoding = getattr(stream, "encoding", None) or "utf-8"
                written = stream.write(text.encode(encoding, "backslashreplace").decode(encoding))
        return written

    def flush(self) -> None:
        with self._failing():
            self._open().flush()

    @contextlib.contextmanager
    def _failing(self) -> Iterator[None]:
        """The stream's OSError raised as OutputFailed, the first one kept (see `failure`)."""
        try:
            yield
        except OutputFailed as err:
            self.failure = self.failure or err
            raise
        except OSError as err:
            self.failure = self.failure or OutputFailed(err.errno, err.strerror)
            raise self.failure from err

    def _open(self) -> TextIO:
        if self.stream is None:
            raise OutputFailed(errno.EBADF, "standard output is closed")
        return self.stream

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, isatty...: the stream's own
        return getattr(self._open(), name)


class Diagnostics:
    """What `sys.stderr` is while a command runs: the stream itself, but a write or flush that fails (a
    full disk, a reader gone) or a stream closed at start (`2>&-`, where Python has no sys.stderr and
    `print(file=sys.stderr)` would write to standard output instead) is dropped. There is nowhere left to
    say it, and the exit code still tells the caller what happened; without this, a message that cannot
    be written becomes a traceback that cannot be written either, and exit 1 in place of the command's
    own code."""

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream
        self.failed = False

    def write(self, text: str) -> int:
        if self.stream is not None:
            try:
                self.stream.write(text)
            except (OSError, ValueError):  # ValueError: the stream was closed under us
                self.failed = True
        return len(text)

    def flush(self) -> None:
        if self.stream is not None:
            try:
                self.stream.flush()
            except (OSError, ValueError):
                self.failed = True

    def settle(self) -> None:
        """After a write failed: what the stream still buffers goes nowhere, rather than failing again
        when the interpreter flushes it at exit (which would turn the exit code into 120)."""
        if self.failed and self.stream is not None:
            discard(self.stream)

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, isatty...: the stream's own
        if self.stream is None:
            raise AttributeError(name)
        return getattr(self.stream, name)
