"""What a failed request means: the errors the client raises, and how a caller tells a conflict, an
unavailable API, an expired watch and a refusal apart."""

from __future__ import annotations

import contextlib
import http
import json


class ConfigError(ValueError):
    """The credentials cannot be loaded; the message is one line an operator can act on."""


class ApiError(Exception):
    """An HTTP answer other than 2xx. `status` 0: no answer at all (connection refused, timeout)."""

    def __init__(self, status: int, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class ApiFailure(Exception):
    """A request the API did not answer with success, and what trying again can do.

    kind: "conflict" (stale resourceVersion, or the object already exists: re-read and decide again),
    "unavailable" (5xx, 429, no connection: back off and retry), "gone" (a watch's resourceVersion is too
    old: list again), "rejected" (any other 4xx: retrying the same request cannot help). A caller may add
    kinds of its own for answers it expects (the agent's "node_missing")."""

    def __init__(self, kind: str, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status

    @property
    def retryable(self) -> bool:
        return self.kind in ("conflict", "unavailable")


def classify(exc: ApiError, what: str = "") -> ApiFailure:
    """The failure `exc` is, its message prefixed with `what` the caller was doing."""
    status = exc.status
    message = f"{what}: {exc}" if what else str(exc)
    if status == http.HTTPStatus.CONFLICT:
        return ApiFailure("conflict", message, status)
    if status == http.HTTPStatus.GONE:
        return ApiFailure("gone", message, status)
    if status in (0, http.HTTPStatus.TOO_MANY_REQUESTS) or status >= 500:
        return ApiFailure("unavailable", message, status)
    return ApiFailure("rejected", message, status)


def status_error(method: str, path: str, status: int, raw: bytes) -> ApiError:
    """The API's Status body, reduced to one line: its reason and message."""
    reason, message = "", ""
    with contextlib.suppress(ValueError, AttributeError):
        status_obj = json.loads(raw)
        reason = str(status_obj.get("reason") or "")
        message = str(status_obj.get("message") or "")
    text = f"{method} {path}: HTTP {status} {reason}".rstrip()
    if message:
        text += f": {message[:300]}"
    return ApiError(status, text, reason)
