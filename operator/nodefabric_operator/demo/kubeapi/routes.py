"""Kubernetes API URLs: which resource, namespace, object and subresource a request is about, and its
verb; and the opaque `continue` tokens of paged lists."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kmock

from nodefabric_operator.demo.kubeapi import errors
from nodefabric_operator.demo.kubeapi.store import Key


@dataclass(frozen=True)
class Route:
    group: str
    version: str
    plural: str
    namespace: str | None
    name: str | None
    sub: str | None

    @property
    def key(self) -> str:
        return f"{self.group}/{self.version}/{self.plural}" if self.group else f"{self.version}/{self.plural}"


def parse_route(path: str) -> Route | None:
    """A resource URL's parts; None for anything else (discovery, OpenAPI, health)."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 3 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    namespace_sub = not group and len(rest) == 3 and rest[2] in ("status", "finalize")
    if rest[0] == "namespaces" and len(rest) >= 3 and not namespace_sub:
        namespace, rest = rest[1], rest[2:]
    name = rest[1] if len(rest) > 1 else None
    return Route(group, version, rest[0], namespace, name, "/".join(rest[2:]) or None)


def verb(method: str, route: Route, params: Mapping[str, str]) -> str | None:
    if method == "GET":
        if params.get("watch") in ("true", "True", "TRUE", "t", "T", "1"):
            return "watch"
        return "get" if route.name else "list"
    if method == "POST":
        return "create"
    if method == "PUT":
        return "update" if route.name else None
    if method == "PATCH":
        return "patch" if route.name else None
    if method == "DELETE":
        return "delete" if route.name else "deletecollection"
    return None


def continue_token(rv: int, key: Key) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": list(key)}).encode()
    return base64.urlsafe_b64encode(raw).decode()


def read_continue(token: str) -> tuple[int, Key]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        ns, name = data["start"]
        return int(data["rv"]), (str(ns), str(name))
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise errors.bad_request(f"continue key is not valid: {token!r}") from None


def resource_key(ref: Any) -> str:
    if not isinstance(ref, kmock.resource):
        ref = kmock.resource(ref)
    return f"{ref.group}/{ref.version}/{ref.plural}" if ref.group else f"{ref.version}/{ref.plural}"
