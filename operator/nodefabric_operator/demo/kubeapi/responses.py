"""The API server's answers as HTTP responses: an object (with `Warning` headers), a Status for an
error, and whether the client asked for a Table."""

from __future__ import annotations

from typing import Any

import aiohttp.web
from multidict import CIMultiDict

from nodefabric_operator.demo.kubeapi.admission import header
from nodefabric_operator.demo.kubeapi.errors import ApiError
from nodefabric_operator.demo.kubeapi.watch import dumps


def respond(obj: Any, status: int = 200, warnings: list[str] | None = None) -> aiohttp.web.Response:
    headers = _warning_headers(warnings or [])
    return aiohttp.web.Response(
        body=dumps(obj), status=status, content_type="application/json", headers=headers
    )


def error(err: ApiError) -> aiohttp.web.Response:
    return aiohttp.web.Response(
        body=dumps(err.status()), status=err.code, content_type="application/json", headers=err.headers
    )


def table_wanted(request: Any) -> bool:
    return "as=Table" in header(request, "Accept")


def _warning_headers(warnings: list[str]) -> CIMultiDict[str]:
    headers: CIMultiDict[str] = CIMultiDict()
    for text in warnings:
        headers.add("Warning", '299 - "' + text.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return headers
