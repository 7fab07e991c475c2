"""OpenAPI v3, as the API server publishes it: `/openapi/v3` and one document per group-version.

kubectl reads it for `explain` (the schema whose `x-kubernetes-group-version-kind` names the kind) and
to learn that the server validates fields itself (a `fieldValidation` query parameter on the PATCH
operation), after which `kubectl create/apply` send `fieldValidation=Strict` instead of validating on
the client. A custom resource's schema is its CRD's openAPIV3Schema, with the standard apiVersion,
kind and metadata fields the API server adds.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable
from typing import Any

from nodefabric_operator.demo.kubeapi.catalogue import ResourceType

META = "io.k8s.apimachinery.pkg.apis.meta.v1"
_API_VERSION = (
    "APIVersion defines the versioned schema of this representation of an object. Servers should convert "
    "recognized schemas to the latest internal value, and may reject unrecognized values. More info: "
    "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources"
)
_KIND = (
    "Kind is a string value representing the REST resource this object represents. Servers may infer this "
    "from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: "
    "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds"
)
_METADATA = (
    "Standard object's metadata. More info: "
    "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"
)


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _string(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string", "default": ""}}
_META_SCHEMAS: dict[str, Any] = {
    f"{META}.ObjectMeta": {
        "type": "object",
        "description": "ObjectMeta is metadata that all persisted resources must have, which includes all "
        "objects users must create.",
        "properties": {
            "name": _string("Name must be unique within a namespace. Cannot be updated."),
            "generateName": _string("An optional prefix the server uses to generate a unique name."),
            "namespace": _string("Namespace defines the space within which each name must be unique."),
            "uid": _string("UID is the unique in time and space value for this object. Read-only."),
            "resourceVersion": _string(
                "An opaque value that represents the internal version of this object."
            ),
            "generation": {
                "type": "integer",
                "format": "int64",
                "description": "A sequence number representing a specific generation of the desired state.",
            },
            "creationTimestamp": {
                **_string("The server time when this object was created."),
                "format": "date-time",
            },
            "deletionTimestamp": {**_string("When this resource will be deleted."), "format": "date-time"},
            "labels": {
                **_STRING_MAP,
                "description": "Map of string keys and values to organize and select objects.",
            },
            "annotations": {
                **_STRING_MAP,
                "description": "Unstructured key value map stored with a resource.",
            },
            "ownerReferences": {
                "type": "array",
                "items": {"allOf": [_ref(f"{META}.OwnerReference")], "default": {}},
                "description": "List of objects depended by this object.",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["uid"],
            },
            "finalizers": {
                "type": "array",
                "items": {"type": "string", "default": ""},
                "description": "Must be empty before the object is deleted from the registry.",
                "x-kubernetes-list-type": "set",
            },
        },
    },
    f"{META}.OwnerReference": {
        "type": "object",
        "description": "OwnerReference contains enough information to let you identify an owning object.",
        "required": ["apiVersion", "kind", "name", "uid"],
        "properties": {
            "apiVersion": _string("API version of the referent."),
            "kind": _string("Kind of the referent."),
            "name": _string("Name of the referent."),
            "uid": _string("UID of the referent."),
            "controller": {
                "type": "boolean",
                "description": "If true, this reference points to the managing controller.",
            },
            "blockOwnerDeletion": {
                "type": "boolean",
                "description": "If true, the owner cannot be deleted before this object.",
            },
        },
        "x-kubernetes-map-type": "atomic",
    },
    f"{META}.ListMeta": {
        "type": "object",
        "description": "ListMeta describes metadata that synthetic resources must have.",
        "properties": {
            "resourceVersion": _string("The version of the list, for watches that continue from it."),
            "continue": _string("Set when more items are available; pass it to fetch them."),
            "remainingItemCount": {
                "type": "integer",
                "format": "int64",
                "description": "Items not yet returned.",
            },
        },
    },
}

_FIELD_VALIDATION = {
    "name": "fieldValidation",
    "in": "query",
    "description": "How the server handles fields it does not know: Ignore, Warn (default) or Strict.",
    "schema": {"type": "string", "uniqueItems": True},
}
_DRY_RUN = {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": True}}


def schema_name(rt: ResourceType) -> str:
    """`io.k8s.api.core.v1.Node` for built-ins, reversed group then version and kind for the rest."""
    if not rt.group:
        prefix = "io.k8s.api.core"
    elif rt.group.endswith(".k8s.io") and "." not in rt.group.removesuffix(".k8s.io"):
        prefix = f"io.k8s.api.{rt.group.removesuffix('.k8s.io')}"
    else:
        prefix = ".".join(reversed(rt.group.split(".")))
    return f"{prefix}.{rt.version}.{rt.kind}"


def _gvk(rt: ResourceType, kind: str) -> dict[str, str]:
    return {"group": rt.group, "kind": kind, "version": rt.version}


def _schemas(rt: ResourceType) -> dict[str, Any]:
    name = schema_name(rt)
    if rt.schema is not None:
        body = copy.deepcopy(dict(rt.schema.schema))
    else:
        body = {"type": "object", "description": f"{rt.kind} (served without a schema by this emulator)."}
        body["x-kubernetes-preserve-unknown-fields"] = True
    body["properties"] = {
        **(body.get("properties") or {}),
        "apiVersion": _string(_API_VERSION),
        "kind": _string(_KIND),
        "metadata": {"allOf": [_ref(f"{META}.ObjectMeta")], "default": {}, "description": _METADATA},
    }
    body["x-kubernetes-group-version-kind"] = [_gvk(rt, rt.kind)]
    listed = {
        "type": "object",
        "description": f"{rt.list_kind} is a list of {rt.kind}",
        "required": ["items"],
        "properties": {
            "apiVersion": _string(_API_VERSION),
            "items": {"type": "array", "items": _ref(name), "description": f"List of {rt.plural}."},
            "kind": _string(_KIND),
            "metadata": {"allOf": [_ref(f"{META}.ListMeta")], "default": {}, "description": _METADATA},
        },
        "x-kubernetes-group-version-kind": [_gvk(rt, rt.list_kind)],
    }
    return {name: body, f"{name}List": listed}


def _operation(
    rt: ResourceType, action: str, schema: str, params: Iterable[dict[str, Any]] = ()
) -> dict[str, Any]:
    return {
        "operationId": f"{action}{rt.kind}",
        "parameters": list(params),
        "responses": {
            "200": {"description": "OK", "content": {"application/json": {"schema": _ref(schema)}}}
        },
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": _gvk(rt, rt.kind),
    }


def _paths(rt: ResourceType) -> dict[str, Any]:
    base = f"/api/{rt.version}" if not rt.group else f"/apis/{rt.group}/{rt.version}"
    collection = f"{base}/namespaces/{{namespace}}/{rt.plural}" if rt.namespaced else f"{base}/{rt.plural}"
    name = schema_name(rt)
    writes = (_FIELD_VALIDATION, _DRY_RUN)
    paths = {
        collection: {
            "get": _operation(rt, "list", f"{name}List"),
            "post": _operation(rt, "post", name, writes),
        },
        f"{collection}/{{name}}": {
            "get": _operation(rt, "get", name),
            "put": _operation(rt, "put", name, writes),
            "patch": _operation(rt, "patch", name, writes),
            "delete": _operation(rt, "delete", name, (_DRY_RUN,)),
        },
    }
    for sub in rt.subresources & {"status"}:
        paths[f"{collection}/{{name}}/{sub}"] = {
            "get": _operation(rt, "get", name),
            "put": _operation(rt, "put", name, writes),
            "patch": _operation(rt, "patch", name, writes),
        }
    return paths


def document(types: Iterable[ResourceType], version: str) -> dict[str, Any]:
    """The OpenAPI v3 document of one group-version."""
    schemas: dict[str, Any] = dict(_META_SCHEMAS)
    paths: dict[str, Any] = {}
    for rt in sorted(types, key=lambda t: t.plural):
        schemas.update(_schemas(rt))
        paths.update(_paths(rt))
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": version},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def digest(doc: Any) -> str:
    return hashlib.sha512(json.dumps(doc, sort_keys=True).encode()).hexdigest().upper()[:128]
