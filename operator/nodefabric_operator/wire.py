"""What both of the operator's clients (aioclient on the event loop, rawcall in a worker thread) accept of
an answer, and when they send a request again: one set of bounds and decisions, so a server or a proxy
in front of it is met the same way by either.

An answer's body is read up to MAX_ANSWER and refused beyond it (AnswerTooLarge), never cut and parsed:
the largest answer the operator reads is one object (a Devices record with its status, a Node, a
NodeFeature: tens of KB), and the API server refuses to store an object over 1.5 MiB of its own
(etcd's request limit), so 64 MiB is only ever reached by something that is not an answer (a proxy's
endless page, a broken server streaming forever) that would otherwise be buffered whole in memory.

A header line is accepted up to MAX_HEADER_LINE bytes: http.client's own bound (its _MAXLINE), which the
threaded client reads answers with; aiohttp's default (8,190) refused a header the threaded client took.
As many as MAX_HEADERS header lines are, http.client's bound too (aiohttp's 128 took what it refused).

A connection the server closes with no answer (a kept-alive one it had just timed out as the request
went out, the commonest case; or a server that died reading it) leaves the request's fate unknown: it
may never have been read, or been acted on. Either client sends a request once more, at once, on
another connection (the pools drop one they find closed before sending on it), only when sending it
twice does no harm (`resendable`): a read, a PUT or DELETE, a merge patch (values set, not added to;
the status write's resourceVersion precondition makes a second one a 409, read as superseded), a
create that names its object (a second one is refused AlreadyExists, on which the sink reads the object
back). A create with a generated name (an Event: metadata.generateName) may have been received: sent
again it could make a second object, so it is not resent; its failure is its caller's (an Event post
is logged and counted failed). The reconcile's own retry, with backoff, is what it always was.
"""

from __future__ import annotations

from typing import Any

MAX_ANSWER = 64 * 1024 * 1024  # bytes of one answer's body (decoded), at most
MAX_HEADER_LINE = 65536  # bytes of one line of an answer's head (http.client's _MAXLINE)
# Header lines of one answer, at most: what http.client takes (its _MAXHEADERS, 100 lines, counts the
# head's closing blank line), where aiohttp took 128.
MAX_HEADERS = 99
CHUNK = 1024 * 1024  # read at a time (the threaded client always, the loop's when no size is announced)


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


IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})  # RFC 9110 9.2.2
# Patches that set values (a second application finds them set): not a JSON patch, whose "add" to a
# list adds again.
SETTING_PATCHES = frozenset(
    {"application/merge-patch+json", "application/strategic-merge-patch+json", "application/apply-patch+yaml"}
)


def resendable(method: str, body: Any, content_type: str) -> bool:
    """Whether a request whose connection closed with no answer may be sent once more (see the module's
    note): sent twice, it does nothing the first did not."""
    method = method.upper()
    if method in IDEMPOTENT:
        return True
    if method == "PATCH":  # asked on every request: the content type as the operator writes it first
        return content_type in SETTING_PATCHES or _media_type(content_type) in SETTING_PATCHES
    if method == "POST" and isinstance(body, dict):
        meta = body.get("metadata")
        return isinstance(meta, dict) and isinstance(meta.get("name"), str) and bool(meta["name"])
    return False


def _media_type(content_type: str) -> str:
    return content_type.split(";", maxsplit=1)[0].strip().lower()


def refresh_and_resend(status: int, refreshable: bool) -> bool:
    """Whether a refusal is answered by refreshing the credential and sending the request once more: a
    401 (a credential that expired inside the refresh hook's second) with a hook to refresh it. Safe
    for any method: authentication refuses a request before anything acts on it."""
    return status == 401 and refreshable
