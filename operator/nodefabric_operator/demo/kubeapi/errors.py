"""The API server's refusals: status codes, reasons and `Status` bodies as a real one sends them.

Clients read more than the code: kubectl prints `message`, client-go and kopf branch on `reason`, and
a 422 carries `details.causes` (one per refused field), so each refusal here is built the way
apimachinery's `errors.New*` builds it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Cause:
    """One refused field: `field.Error` as the API server turns it into a `StatusCause`."""

    reason: str  # FieldValueInvalid, FieldValueRequired, FieldValueNotSupported, ...
    field: str
    message: str  # the error body, e.g. `Invalid value: "x": must be ...`

    def as_dict(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.message, "field": self.field}

    def text(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


@dataclass
class ApiError(Exception):
    """A refusal: raised anywhere on the request path, answered as a `Status` with its code."""

    code: int
    reason: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.message}"

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


def _details(name: str | None, group: str, kind: str, **more: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if name:
        out["name"] = name
    if group:
        out["group"] = group
    out["kind"] = kind
    out.update(more)
    return out


def _qualified(plural: str, group: str) -> str:
    return f"{plural}.{group}" if group else plural


def not_found(plural: str, group: str, name: str) -> ApiError:
    return ApiError(
        404, "NotFound", f'{_qualified(plural, group)} "{name}" not found', _details(name, group, plural)
    )


def no_such_resource() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def namespace_not_found(name: str) -> ApiError:
    return ApiError(404, "NotFound", f'namespaces "{name}" not found', _details(name, "", "namespaces"))


def already_exists(plural: str, group: str, name: str) -> ApiError:
    return ApiError(
        409,
        "AlreadyExists",
        f'{_qualified(plural, group)} "{name}" already exists',
        _details(name, group, plural),
    )


def conflict(plural: str, group: str, name: str, why: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {_qualified(plural, group)} "{name}": {why}',
        _details(name, group, plural),
    )


STALE = "the object has been modified; please apply your changes to the latest version and try again"


def invalid(kind: str, group: str, name: str, causes: Iterable[Cause]) -> ApiError:
    """422 Invalid: `Kind.group "name" is invalid: <cause>` or `...: [<cause>, <cause>]`."""
    causes = list(causes)
    texts = [c.text() for c in causes]
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    qualified = f"{kind}.{group}" if group else kind
    return ApiError(
        422,
        "Invalid",
        f'{qualified} "{name}" is invalid: {joined}',
        _details(name, group, kind, causes=[c.as_dict() for c in causes]),
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message, {})


def method_not_allowed() -> ApiError:
    return ApiError(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
    )


def unsupported_media_type(content_type: str, accepted: Iterable[str]) -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - accepted media types include: "
        f"{', '.join(accepted)}",
        {},
    )


def too_large(limit: int) -> ApiError:
    return ApiError(413, "RequestEntityTooLarge", f"Request entity too large: limit is {limit}", {})


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized", {})


def expired(wanted: str, oldest: int) -> ApiError:
    return ApiError(410, "Expired", f"too old resource version: {wanted} ({oldest})", {})


_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def injected(code: int) -> ApiError:
    """A fault a test asked for (`KubeAPI.fail_next`): the reason a real server gives that code."""
    headers = {"Retry-After": "1"} if code in (429, 503) else {}
    return ApiError(code, _REASONS.get(code, "Unknown"), f"injected HTTP {code}", {}, headers)
