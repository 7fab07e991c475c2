"""The documents a client reads before it touches a resource: `/version`, `/api`, `/apis`, each group and
group-version (kubectl maps `device`, `devices`, `nodes` to resources with them), the root path list
and OpenAPI v3 (`/openapi/v3` and one document per group-version)."""

from __future__ import annotations

import collections
from typing import Any

from nodefabric_operator.demo.kubeapi import openapi
from nodefabric_operator.demo.kubeapi.catalogue import Catalogue, ResourceType

SERVER_VERSION = {
    "major": "1",
    "minor": "34",
    "gitVersion": "v1.34.0",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-08-27T00:00:00Z",
    "goVersion": "go1.24.6",
    "compiler": "gc",
    "platform": "linux/amd64",
}
HEALTH = frozenset({"/healthz", "/livez", "/readyz"})


def _paths(catalogue: Catalogue) -> list[str]:
    paths = {"/api", "/apis", "/version", "/openapi/v3", *HEALTH}
    for group, versions in catalogue.groups().items():
        for version in versions:
            paths.add(f"/apis/{group}/{version}" if group else f"/api/{version}")
        if group:
            paths.add(f"/apis/{group}")
    return sorted(paths)


def _openapi_documents(catalogue: Catalogue) -> dict[str, dict[str, Any]]:
    by_gv: dict[str, list[ResourceType]] = collections.defaultdict(list)
    for rt in catalogue:
        by_gv[f"apis/{rt.group}/{rt.version}" if rt.group else f"api/{rt.version}"].append(rt)
    return {gv: openapi.document(types, SERVER_VERSION["gitVersion"]) for gv, types in by_gv.items()}


def document(catalogue: Catalogue, path: str) -> Any | None:
    """The document served at `path` (a GET), or None: the API server's 404."""
    path = "/" + path.strip("/")
    if path == "/version":
        return SERVER_VERSION
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
    if path == "/apis":
        return catalogue.api_group_list()
    if path == "/":
        return {"paths": _paths(catalogue)}
    if path == "/openapi/v3":
        docs = _openapi_documents(catalogue)
        urls = {gv: f"/openapi/v3/{gv}?hash={openapi.digest(doc)}" for gv, doc in docs.items()}
        return {"paths": {gv: {"serverRelativeURL": url} for gv, url in urls.items()}}
    if path.startswith("/openapi/v3/"):
        return _openapi_documents(catalogue).get(path.removeprefix("/openapi/v3/"))
    parts = path.strip("/").split("/")
    if parts[0] == "api" and len(parts) == 2:
        return catalogue.resource_list("", parts[1])
    if parts[0] == "apis" and len(parts) == 2:
        return catalogue.api_group(parts[1])
    if parts[0] == "apis" and len(parts) == 3:
        return catalogue.resource_list(parts[1], parts[2])
    return None
