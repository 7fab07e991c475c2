"""Small readers and builders of API objects: a name as a path segment, metadata, resourceVersion, an
owner reference to a Node and the Node's uid."""

from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING, Any

from nodefabric_devicemanager.nodeclient.errors import ApiFailure

if TYPE_CHECKING:
    from nodefabric_devicemanager.nodeclient.client import Api


def path_name(name: str) -> str:
    """An object name as one path segment: a name the API server would refuse must not become a path."""
    return urllib.parse.quote(name, safe="")


def metadata(obj: Any) -> dict[str, Any]:
    """An object's metadata; {} when there is none, or the answer is not shaped like an object at all (a
    broken proxy or API server): one odd answer must cost that answer, never the loop reading it."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return meta if isinstance(meta, dict) else {}


def resource_version(obj: Any) -> str:
    version = metadata(obj).get("resourceVersion")
    return version if isinstance(version, str) else ""


def owner_reference(node: str, uid: str) -> dict[str, Any]:
    """An owner reference to a Node: what is owned goes when the Node goes."""
    return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}


def node_uid(api: Api, node: str) -> str | None:
    """The uid of the Node `node`, read fresh (a Node deleted and registered again has a new one); None
    when it does not exist. Raises ApiFailure ("rejected" for an answer without a uid)."""
    obj = api.read(f"read node {node}", f"/api/v1/nodes/{path_name(node)}")
    if obj is None:
        return None
    uid = metadata(obj).get("uid")
    if not isinstance(uid, str) or not uid:
        raise ApiFailure("rejected", f"node {node} has no uid")
    return uid
