"""The one start-up error of every command, and how it ends the process: one structured log line
("<command> cannot start", error=<the reason>) and exit status 2, never a traceback."""

from __future__ import annotations

import logging
from typing import Any

EXIT_USAGE = 2
# A reason longer than this is cut: it is one log line, and an exception's text can be a whole document.
MAX_REASON_CHARS = 2000


class StartupError(ValueError):
    """A setting (or a state of the world) a command cannot start with; the message is the one line an
    operator reads. A ValueError, so the checks that build a configuration may raise it or a plain
    ValueError alike."""


def first_line(err: BaseException | str) -> str:
    """The first line of an error's text (at most 300 characters), or its type when it has none: for
    errors whose later lines are noise (an HTTP response body, a traceback in a message)."""
    text = str(err).strip()
    if not text:
        return type(err).__name__ if isinstance(err, BaseException) else "no reason given"
    return text.splitlines()[0][:300]


def one_line(err: BaseException | str) -> str:
    """An error's whole text on one line (its lines joined by "; "), at most MAX_REASON_CHARS: a
    validation error names the field on its second line."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if not lines:
        return first_line(err)
    text = "; ".join(lines)
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def refuse(log: logging.Logger, command: str, err: BaseException | str, **fields: Any) -> int:
    """Log why `command` cannot start, as one line, and return the exit status that says so (2)."""
    log.error(f"{command} cannot start", extra={"error": one_line(err), **fields})
    return EXIT_USAGE


__all__ = ["EXIT_USAGE", "StartupError", "first_line", "one_line", "refuse"]
