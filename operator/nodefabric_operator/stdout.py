"""Standard output as a command prints to it, with its failures told apart from every other OSError.

A command's output can fail in ways that are the caller's doing, not a bug: the reader stops early
(`nodefabric inventory | head`), the file it goes to fills its disk, or the shell closed it (`>&-`).
Each is one line (or, for the reader gone, the quiet end a filter has), never a traceback; an OSError
from anything else the command does still shows as the bug it is.
"""

from __future__ import annotations

import errno
from typing import Any, TextIO


class OutputFailed(OSError):
    """Writing standard output failed; `errno` and `strerror` are the write's."""


class Output:
    """What `sys.stdout` is while a command runs: the stream itself, or None when the process started
    with it closed, its writes and flushes raising OutputFailed."""

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self._open().write(text)
        except OutputFailed:
            raise
        except OSError as err:
            raise OutputFailed(err.errno, err.strerror) from err

    def flush(self) -> None:
        try:
            self._open().flush()
        except OutputFailed:
            raise
        except OSError as err:
            raise OutputFailed(err.errno, err.strerror) from err

    def _open(self) -> TextIO:
        if self.stream is None:
            raise OutputFailed(errno.EBADF, "standard output is closed")
        return self.stream

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, isatty...: the stream's own
        return getattr(self._open(), name)
