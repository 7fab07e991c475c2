"""The PATCH content types the API server accepts, applied as it applies them.

- `application/merge-patch+json` (RFC 7386): maps merge, null deletes, lists are replaced.
- `application/strategic-merge-patch+json` (built-in kinds only; the Python client sends it for a dict
  body): a merge patch whose lists of objects merge by their patch key (conditions by type, owner
  references by uid, containers by name...), whose finalizers merge as a set, with the `$patch`,
  `$deleteFromPrimitiveList` and `$setElementOrder` directives. Custom resources refuse it with 415.
- `application/json-patch+json` (RFC 6902), by the jsonpatch library kopf already brings.
Server-side apply (`application/apply-patch+yaml`) is not served: 415, and the README says so.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch

from nodefabric_operator.demo.kubeapi.errors import ApiError, bad_request, unsupported_media_type

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"

# Lists of objects a strategic merge patch merges by key (patchMergeKey in the built-in types).
_MERGE_KEYS = {
    "conditions": "type",
    "addresses": "type",
    "ownerReferences": "uid",
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "env": "name",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "readinessGates": "conditionType",
}
_PRIMITIVE_SETS = {"finalizers"}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386. Unchanged parts of `target` are shared, never mutated: stored objects are immutable."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key == "$patch" or key.startswith(("$setElementOrder/", "$retainKeys")):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.partition("/")[2]
            drop = set(value) if isinstance(value, list) else set()
            out[name] = [v for v in out.get(name) or [] if v not in drop]
            continue
        if value is None:
            out.pop(key, None)
        elif isinstance(value, list) and key in _MERGE_KEYS and isinstance(out.get(key), list):
            out[key] = _merge_list(out[key], value, _MERGE_KEYS[key])
        elif isinstance(value, list) and key in _PRIMITIVE_SETS and isinstance(out.get(key), list):
            out[key] = list(dict.fromkeys([*out[key], *value]))
        else:
            merged = strategic_merge_patch(out.get(key), value)
            if merged is None:
                out.pop(key, None)
            else:
                out[key] = merged
    return out


def _merge_list(current: list[Any], patch: list[Any], key: str) -> list[Any]:
    out = list(current)
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            out.append(copy.deepcopy(item))
            continue
        index = next((i for i, c in enumerate(out) if isinstance(c, dict) and c.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if index is not None:
                del out[index]
        elif index is None:
            out.append({k: copy.deepcopy(v) for k, v in item.items() if k != "$patch"})
        else:
            out[index] = strategic_merge_patch(out[index], item)
    return out


def media_type(header: str) -> str:
    return header.split(";", 1)[0].strip().lower()


def apply_patch(current: dict[str, Any], body: Any, content_type: str, *, custom: bool) -> dict[str, Any]:
    """The patched object, or the API server's refusal of the patch itself (400, 415, 422)."""
    kind = media_type(content_type)
    accepted = [JSON_PATCH, MERGE] + ([] if custom else [STRATEGIC])
    if kind == JSON_PATCH:
        if not isinstance(body, list):
            raise bad_request(
                f"json: cannot unmarshal {_json_kind(body)} into Go value of type jsonpatch.Patch"
            )
        try:
            result = jsonpatch.JsonPatch(body).apply(current)
        except (jsonpatch.InvalidJsonPatch, TypeError, AttributeError) as err:
            raise bad_request(str(err)) from None
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as err:
            raise ApiError(422, "Invalid", str(err), {}) from None
        if not isinstance(result, dict):
            raise bad_request("the patched object is not a JSON object")
        return result
    if kind not in (MERGE, STRATEGIC) or (kind == STRATEGIC and custom):
        raise unsupported_media_type(kind, accepted)
    if not isinstance(body, dict):
        raise bad_request(
            f"json: cannot unmarshal {_json_kind(body)} into Go value of type map[string]interface {{}}"
        )
    patched = merge_patch(current, body) if kind == MERGE else strategic_merge_patch(current, body)
    return patched if isinstance(patched, dict) else {}


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "bool"
    return "number" if isinstance(value, int | float) else "null"
