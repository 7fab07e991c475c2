"""What both of the operator's clients (aioclient on the event loop, rawcall in a worker thread) accept of
an answer: one set of bounds, so a server or a proxy in front of it is met the same way by either.

An answer's body is read up to MAX_ANSWER and refused beyond it (AnswerTooLarge), never cut and parsed:
the largest answer the operator reads is one object (a Devices record with its status, a Node, a
NodeFeature: tens of KB), and the API server refuses to store an object over 1.5 MiB of its own
(etcd's request limit), so 64 MiB is only ever reached by something that is not an answer (a proxy's
endless page, a broken server streaming forever) that would otherwise be buffered whole in memory.

A header line is accepted up to MAX_HEADER_LINE bytes: http.client's own bound (its _MAXLINE), which the
threaded client reads answers with; aiohttp's default (8,190) refused a header the threaded client took.
"""

from __future__ import annotations

MAX_ANSWER = 64 * 1024 * 1024  # bytes of one answer's body (decoded), at most
MAX_HEADER_LINE = 65536  # bytes of one line of an answer's head (http.client's _MAXLINE)
CHUNK = 1024 * 1024  # read at a time when an answer's size is not known up front


class AnswerTooLarge(OSError):
    """An answer's body went past MAX_ANSWER: the call failed, as with a broken connection (an OSError,
    so every caller retries it as it retries those), and the connection was closed unread."""

    def __init__(self, size: int | None = None) -> None:
        said = f" (Content-Length {size})" if size is not None else ""
        super().__init__(
            f"the API server's answer is larger than {MAX_ANSWER} bytes{said}: refused, not read "
            "(a proxy or a broken server in front of the API?)"
        )


def too_large(size: int | None) -> bool:
    """Whether an answer announcing (or having read) `size` bytes of body is to be refused."""
    return size is not None and size > MAX_ANSWER
