"""What the API server does to a write before it stores it: decode the body, then admit the object.

Admission here is the API server's own (no webhooks): ObjectMeta decoding and validation for every
resource, apiVersion/kind and namespace consistency, a custom resource's structural schema (pruning with
`fieldValidation` warnings or Strict refusal, defaulting, validation with ratcheting on updates), and the
checks the API server makes of a CustomResourceDefinition.
"""

from __future__ import annotations

import datetime
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from nodefabric_operator.demo.kubeapi import errors
from nodefabric_operator.demo.kubeapi.catalogue import ResourceType
from nodefabric_operator.demo.kubeapi.errors import Cause
from nodefabric_operator.demo.kubeapi.naming import name_rule, spec_causes
from nodefabric_operator.demo.kubeapi.patches import media_type
from nodefabric_operator.demo.kubeapi.store import meta
from nodefabric_operator.demo.kubeapi.structural import Structural
from nodefabric_operator.demo.kubeapi.validation import (
    OBJECT_META_FIELDS,
    check_meta_types,
    invalid,
    meta_causes,
    out_of_range_numbers,
    required,
)

CRDS = "apiextensions.k8s.io/v1/customresourcedefinitions"
NAMESPACES = "v1/namespaces"


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid character '{name[0]}' looking for beginning of value")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"json: cannot unmarshal number {text} into Go value of type float64")
    return value


# An escaped backslash (kept, so the `\\u` after it is no escape), a surrogate pair (kept: one character)
# or half of one: Go's decoder reads the half as U+FFFD, where Python's would keep a string no UTF-8
# length check can encode. Rewritten in the text, so no walk of a deeply nested body is needed.
_ESCAPES = re.compile(
    r"\\\\|\\u[dD][89abAB][0-9a-fA-F]{2}(\\u[dD][c-fC-F][0-9a-fA-F]{2})?|\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)


def _go_surrogates(text: str) -> str:
    def one(m: re.Match[str]) -> str:
        token = m.group()
        return token if token == "\\\\" or m.group(1) else "\\ufffd"

    return _ESCAPES.sub(one, text) if "\\u" in text else text


def header(request: Any, name: str) -> str:
    """A request header, case-insensitively (clients differ in how they spell header names)."""
    raw = getattr(request, "_raw_request", None)
    headers = raw.headers if raw is not None else request.headers
    return str(headers.get(name, ""))


def parse_body(request: Any) -> Any:
    """A request's JSON body; the API server's 400 or 415 when it is not one it can decode."""
    kind = media_type(header(request, "Content-Type") or "application/json")
    if request.method.value.upper() in ("POST", "PUT") and not (
        kind == "application/json" or kind.endswith("+json")
    ):
        raise errors.unsupported_media_type(kind, ["application/json"])
    text = request.body.decode("utf-8")
    if not text.strip():
        raise errors.bad_request("the body of the request is empty")
    try:
        return json.loads(_go_surrogates(text), parse_constant=_reject_constant, parse_float=_finite_float)
    except ValueError as err:
        raise errors.bad_request(f"json: {err}") from None
    except RecursionError:
        raise errors.bad_request("json: exceeded max depth") from None


def admit(
    rt: ResourceType,
    obj: Any,
    *,
    namespace: str | None,
    params: Mapping[str, str],
    old: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Decode and validate a candidate object as the API server does before storing it."""
    if not isinstance(obj, dict):
        raise errors.bad_request("Object 'Kind' is missing in the body: it is not a JSON object")
    m = obj.get("metadata")
    m = {} if m is None else m
    check_meta_types(m)
    for field, want in (("apiVersion", rt.group_version), ("kind", rt.kind)):
        have = obj.get(field)
        if have not in (None, "", want):
            raise errors.bad_request(
                f"the {field} in the data ({have}) does not match the expected {field} ({want})"
            )
    if rt.schema is None:
        for path, value in out_of_range_numbers(obj):
            raise errors.bad_request(
                f"json: cannot unmarshal number {value} into Go struct field .{path} of type int64"
            )
    warnings = [f'unknown field "metadata.{k}"' for k in m if k not in OBJECT_META_FIELDS]
    m = {k: v for k, v in m.items() if k in OBJECT_META_FIELDS and v is not None}
    if rt.namespaced:
        if m.get("namespace") and namespace and m["namespace"] != namespace:
            raise errors.bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        if namespace:
            m["namespace"] = namespace
    else:
        m.pop("namespace", None)
    candidate = {**obj, "apiVersion": rt.group_version, "kind": rt.kind, "metadata": m}
    if rt.schema is not None:
        candidate, unknown = rt.schema.normalize(candidate, old)
        warnings += [f'unknown field "{path}"' for path in unknown]
    validation = params.get("fieldValidation", "Warn")
    if validation == "Strict" and warnings:
        raise errors.bad_request("strict decoding error: " + ", ".join(warnings))
    if validation == "Ignore":
        warnings = []
    causes = meta_causes(m, name_errors=name_rule(rt.group, rt.kind))
    if rt.namespaced and not m.get("namespace"):
        causes.append(required("metadata.namespace"))
    if rt.schema is not None:
        causes += rt.schema.causes(candidate, old)
    elif not rt.crd:
        # A built-in kind's own rules (pod specs' names, Service ports, selectors); a CRD's are its schema.
        causes += spec_causes(rt.group, rt.kind, candidate)
    if rt.key == CRDS:
        causes += crd_causes(candidate)
    if causes:
        raise errors.invalid(rt.kind, rt.group, m.get("name") or m.get("generateName") or "", causes)
    return candidate, warnings


def content(obj: Mapping[str, Any], rt: ResourceType) -> dict[str, Any]:
    """What the generation counts: everything but metadata (and status, when it has its own endpoint)."""
    skip = {"metadata", "apiVersion", "kind"} | ({"status"} if "status" in rt.subresources else set())
    return {k: v for k, v in obj.items() if k not in skip}


_STRINGS = {"type": "array", "items": {"type": "string"}}
# The parts of CustomResourceDefinition this API reads, typed as the API server types them: a CRD that
# breaks them is refused with its causes, before anything reads it.
CRD_SCHEMA = Structural(
    {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "spec": {
                "type": "object",
                "required": ["group", "names", "scope", "versions"],
                "properties": {
                    "group": {"type": "string", "minLength": 1},
                    "scope": {"type": "string", "enum": ["Cluster", "Namespaced"]},
                    "names": {
                        "type": "object",
                        "required": ["plural", "kind"],
                        "properties": {
                            "plural": {"type": "string", "minLength": 1},
                            "singular": {"type": "string"},
                            "kind": {"type": "string", "minLength": 1},
                            "listKind": {"type": "string"},
                            "shortNames": _STRINGS,
                            "categories": _STRINGS,
                        },
                    },
                    "versions": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "required": ["name", "served", "storage"],
                            "properties": {
                                "name": {"type": "string", "minLength": 1},
                                "served": {"type": "boolean"},
                                "storage": {"type": "boolean"},
                                "schema": {
                                    "type": "object",
                                    "required": ["openAPIV3Schema"],
                                    "properties": {"openAPIV3Schema": {"type": "object"}},
                                },
                                "subresources": {"type": "object"},
                                "additionalPrinterColumns": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "required": ["name", "type", "jsonPath"],
                                        "properties": {
                                            "name": {"type": "string"},
                                            "type": {"type": "string"},
                                            "jsonPath": {"type": "string"},
                                            "format": {"type": "string"},
                                            "description": {"type": "string"},
                                            "priority": {"type": "integer"},
                                        },
                                    },
                                },
                                "selectableFields": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "required": ["jsonPath"],
                                        "properties": {"jsonPath": {"type": "string"}},
                                    },
                                },
                            },
                        },
                    },
                },
            }
        },
    }
)


def crd_causes(crd: Mapping[str, Any]) -> list[Cause]:
    """What the API server checks of a CRD itself (beyond its metadata): its shape, then its meaning."""
    causes = CRD_SCHEMA.causes(crd)
    if causes:
        return causes
    spec = crd["spec"]
    name = meta(crd).get("name", "")
    if name != f"{spec['names']['plural']}.{spec['group']}":
        causes.append(invalid("metadata.name", name, 'must be spec.names.plural+"."+spec.group'))
    versions = spec["versions"]
    if sum(bool(v["storage"]) for v in versions) != 1:
        causes.append(
            invalid("spec.versions", versions, "must have exactly one version marked as storage version")
        )
    for i, version in enumerate(versions):
        if "schema" not in version:
            causes.append(required(f"spec.versions[{i}].schema.openAPIV3Schema", "schemas are required"))
            continue
        try:
            Structural(version["schema"]["openAPIV3Schema"]).check()
        except ValueError as err:
            causes.append(invalid(f"spec.versions[{i}].schema.openAPIV3Schema", "", str(err)))
    return causes


_CRD_CONDITIONS = (
    ("NamesAccepted", "NoConflicts", "no conflicts found"),
    ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
)


def crd_status(crd: Mapping[str, Any]) -> dict[str, Any]:
    """What the API server's CRD controllers report of a served CRD: names accepted, established, and
    every version ever stored (the current storage version added to those the status already lists)."""
    spec = crd.get("spec") or {}
    status = dict(crd["status"]) if isinstance(crd.get("status"), dict) else {}
    stored = list(status.get("storedVersions") or [])
    stored += [v["name"] for v in spec.get("versions", []) if v.get("storage") and v["name"] not in stored]
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
    have = {c.get("type") for c in conditions}
    for kind, reason, message in _CRD_CONDITIONS:
        if kind not in have:
            conditions.append(
                {
                    "type": kind,
                    "status": "True",
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": now(),
                }
            )
    return {
        **status,
        "acceptedNames": spec.get("names", {}),
        "storedVersions": stored,
        "conditions": conditions,
    }
