"""A CRD's structural schema, applied as the API server applies it to a custom resource on every write.

In the API server's order: unknown fields are pruned (reported as warnings, or refused under
`fieldValidation=Strict`), nulls in non-nullable fields are dropped, defaults are filled in, then the
object is validated against `openAPIV3Schema` and every violation becomes a 422 cause with the
message kube-openapi writes (types, required fields, enums, bounds, patterns, lengths, item counts,
formats, `x-kubernetes-list-type` map keys and set items unique, `x-kubernetes-int-or-string`).

jsonschema does the standard keywords (OpenAPI 3.0's schema object is JSON Schema draft 4 plus
`nullable`); the Kubernetes extensions are keywords added to its draft-4 validator.
"""

from __future__ import annotations

import copy
import datetime
import re
from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema
from jsonschema import Draft4Validator
from jsonschema.exceptions import ValidationError

from nodefabric_operator.demo.kubeapi.errors import Cause
from nodefabric_operator.demo.kubeapi.validation import INT64_MAX, INT64_MIN, go_value, invalid, required

_MAX_JSON_INT = 2**53  # a float beyond this is not an integer to kube-openapi (swag.IsFloat64AJSONInteger)
_ROOT_FIELDS = ("apiVersion", "kind", "metadata")


def _is_integer(checker: Any, instance: Any) -> bool:
    if isinstance(instance, bool):
        return False
    if isinstance(instance, int):
        return INT64_MIN <= instance <= INT64_MAX
    return isinstance(instance, float) and instance.is_integer() and abs(instance) <= _MAX_JSON_INT


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer" if INT64_MIN <= value <= INT64_MAX else "number"
    if isinstance(value, float):
        return "integer" if _is_integer(None, value) else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


# --- the Kubernetes keywords --------------------------------------------------------------------------


def _list_type(
    validator: Any, kind: str, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if not isinstance(instance, list):
        return
    seen: dict[Any, int] = {}
    for i, item in enumerate(instance):
        if kind == "map":
            if not isinstance(item, dict):
                continue
            keys = schema.get("x-kubernetes-list-map-keys") or []
            key = tuple(_hashable(item.get(k)) for k in keys)
            shown = {k: item[k] for k in keys if k in item}
        elif kind == "set":
            key, shown = _hashable(item), item
        else:
            return
        if key in seen:
            yield ValidationError(
                f"Duplicate value: {go_value(shown)}", validator="x-kubernetes-list-type", path=[i]
            )
        seen.setdefault(key, i)


def _hashable(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


def _int_or_string(
    validator: Any, enabled: bool, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if enabled and instance is not None and not (_is_integer(None, instance) or isinstance(instance, str)):
        yield ValidationError("must be of type integer,string", validator="type")


def _nullable_type(
    validator: Any, types: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    """`type`, where `nullable: true` admits null (OpenAPI 3.0) and int-or-string has its own keyword."""
    if instance is None and schema.get("nullable"):
        return
    if schema.get("x-kubernetes-int-or-string"):
        return
    wanted = [types] if isinstance(types, str) else list(types)
    if not any(validator.is_type(instance, t) for t in wanted):
        yield ValidationError(f"must be of type {','.join(wanted)}", validator="type")


_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def _date_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    if not _RFC3339.fullmatch(value):
        return False
    try:
        datetime.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return False
    return True


def _date(value: object) -> bool:
    if not isinstance(value, str):
        return True
    try:
        datetime.date.fromisoformat(value)
    except ValueError:
        return False
    return len(value) == 10


_UUID = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$")
_FORMATS = jsonschema.FormatChecker(formats=())
_FORMATS.checks("date-time")(_date_time)
_FORMATS.checks("date")(_date)
_FORMATS.checks("uuid")(lambda v: not isinstance(v, str) or bool(_UUID.fullmatch(v)))

_TYPES = Draft4Validator.TYPE_CHECKER.redefine("integer", _is_integer)
Validator = jsonschema.validators.extend(
    Draft4Validator,
    validators={
        "type": _nullable_type,
        "x-kubernetes-list-type": _list_type,
        "x-kubernetes-int-or-string": _int_or_string,
    },
    type_checker=_TYPES,
)


# --- from jsonschema's errors to the API server's causes ---------------------------------------------


def field_path(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _cause(err: ValidationError) -> Cause:
    path = field_path(err.absolute_path)
    kw, limit, value = err.validator, err.validator_value, err.instance
    schema = err.schema if isinstance(err.schema, Mapping) else {}
    where = f"{path} in body"
    if kw == "type":
        actual = _json_type(value)
        return Cause(
            "FieldValueTypeInvalid", path, f'Invalid value: "{actual}": {where} {err.message}: "{actual}"'
        )
    if kw == "required":
        missing = re.match(r"^'(.*)' is a required property$", err.message)
        name = missing.group(1) if missing else ""
        return required(f"{path}.{name}" if path else name)
    if kw == "enum":
        allowed = ", ".join(go_value(v) for v in limit)
        return Cause(
            "FieldValueNotSupported",
            path,
            f"Unsupported value: {go_value(value)}: supported values: {allowed}",
        )
    if kw == "maxLength":
        return Cause("FieldValueTooLong", path, f"Too long: may not be more than {limit} bytes")
    if kw == "minLength":
        return invalid(path, value, f"{where} should be at least {limit} chars long")
    if kw == "pattern":
        return invalid(path, value, f"{where} should match '{limit}'")
    if kw == "maximum":
        strict = schema.get("exclusiveMaximum") is True
        return invalid(path, value, f"{where} should be less than {'' if strict else 'or equal to '}{limit}")
    if kw == "minimum":
        strict = schema.get("exclusiveMinimum") is True
        return invalid(
            path, value, f"{where} should be greater than {'' if strict else 'or equal to '}{limit}"
        )
    if kw == "multipleOf":
        return invalid(path, value, f"{where} should be a multiple of {limit}")
    if kw == "maxItems":
        return Cause("FieldValueTooMany", path, f"Too many: {len(value)}: must have at most {limit} items")
    if kw == "minItems":
        return invalid(path, len(value), f"{where} should have at least {limit} items")
    if kw == "maxProperties":
        return Cause("FieldValueTooMany", path, f"Too many: {len(value)}: must have at most {limit} items")
    if kw == "minProperties":
        return invalid(path, len(value), f"{where} should have at least {limit} properties")
    if kw == "uniqueItems":
        return Cause("FieldValueDuplicate", path, f"Duplicate value: {go_value(value)}")
    if kw == "x-kubernetes-list-type":
        return Cause("FieldValueDuplicate", path, err.message)
    if kw == "format":
        return invalid(path, value, f"{where} must be of type {limit}: {go_value(value)}")
    if kw == "oneOf":
        return invalid(path, value, f"{where} must validate one and only one schema (oneOf)")
    if kw == "anyOf":
        return invalid(path, value, f"{where} must validate at least one schema (anyOf)")
    if kw == "not":
        return invalid(path, value, f"{where} must not validate the schema (not)")
    return invalid(path, value, f"{where} {err.message}")


# --- pruning and defaulting ----------------------------------------------------------------------------


def _declared(schema: Mapping[str, Any]) -> tuple[Mapping[str, Any], Any, bool]:
    props = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
    return props, extra, preserve


def prune(value: Any, schema: Mapping[str, Any], path: str, unknown: list[str]) -> Any:
    """Drop what the schema does not declare (recording it in `unknown`) and nulls it does not allow."""
    if isinstance(value, dict):
        props, extra, preserve = _declared(schema)
        embedded = bool(schema.get("x-kubernetes-embedded-resource"))
        out = {}
        for key, item in value.items():
            sub = f"{path}.{key}" if path else key
            if key in props:
                prop = props[key]
                if item is None and not prop.get("nullable"):
                    continue
                out[key] = prune(item, prop, sub, unknown)
            elif isinstance(extra, Mapping):
                out[key] = prune(item, extra, sub, unknown)
            elif preserve or extra is True or (embedded and key in _ROOT_FIELDS):
                out[key] = item
            else:
                unknown.append(sub)
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [prune(item, schema["items"], f"{path}[{i}]", unknown) for i, item in enumerate(value)]
    return value


def apply_defaults(value: Any, schema: Mapping[str, Any]) -> Any:
    if isinstance(value, dict):
        props, extra, _ = _declared(schema)
        for key, prop in props.items():
            if key not in value and "default" in prop:
                value[key] = copy.deepcopy(prop["default"])
            if key in value:
                value[key] = apply_defaults(value[key], prop)
        if isinstance(extra, Mapping):
            for key in value.keys() - props.keys():
                value[key] = apply_defaults(value[key], extra)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [apply_defaults(item, schema["items"]) for item in value]
    return value


def widen_numbers(value: Any) -> Any:
    """Integers beyond int64 become floats, as the API server's decoder reads them into unstructured JSON."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
        return float(value)
    if isinstance(value, dict):
        return {k: widen_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [widen_numbers(v) for v in value]
    return value


class Structural:
    """One CRD version's openAPIV3Schema: prune, default and validate a custom resource with it.

    On an update, top-level fields equal to the stored object's are neither pruned nor validated
    again: they were when stored, and ratcheting would forgive their errors anyway. A status write
    to a large record costs the status, not the whole record."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self.schema = schema
        props = {k: v for k, v in (schema.get("properties") or {}).items() if k != "metadata"}
        # metadata is ObjectMeta (checked by the generic metadata rules), whatever the CRD says of it.
        self._body = {**schema, "properties": props}
        self._validator = Validator(self._body, format_checker=_FORMATS)
        self._fields = Validator({"type": "object", "properties": props}, format_checker=_FORMATS)
        self._root = {**self._body, "properties": {**props, "apiVersion": _STRING, "kind": _STRING}}

    def check(self) -> None:
        """ValueError when the schema itself is not a valid schema (a CRD the server would refuse)."""
        try:
            Validator.check_schema(self._body)
        except jsonschema.SchemaError as err:
            raise ValueError(err.message) from None

    def normalize(
        self, obj: dict[str, Any], old: Mapping[str, Any] | None = None
    ) -> tuple[dict[str, Any], list[str]]:
        """The object as it would be stored, and the unknown fields dropped from it (paths)."""
        unknown: list[str] = []
        out: dict[str, Any] = {}
        props = self._root["properties"]
        for key, value in obj.items():
            if key == "metadata":
                out[key] = value
            elif old is not None and key in old and old[key] == value:
                out[key] = old[key]
            else:
                out.update(prune({key: widen_numbers(value)}, self._root, "", unknown))
                if key in out and key in props:
                    out[key] = apply_defaults(out[key], props[key])
        for key, prop in props.items():
            if key not in out and "default" in prop:
                out[key] = apply_defaults(copy.deepcopy(prop["default"]), prop)
        return out, unknown

    def causes(self, obj: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> list[Cause]:
        """Every violation; on an update (`old`), not those in parts the update left unchanged."""
        body = {k: v for k, v in obj.items() if k != "metadata"}
        if old is None:
            errors = self._validator.iter_errors(body)
        else:
            changed = {k: v for k, v in body.items() if k not in old or old[k] != v}
            errors = (e for e in self._fields.iter_errors(changed) if not _ratchets(e, old, changed))
        found = [_cause(e) for e in sorted(errors, key=lambda e: [str(p) for p in e.absolute_path])]
        if old is not None:
            found += [required(k) for k in self.schema.get("required") or () if k not in body and k in old]
        return found


_STRING = {"type": "string"}


# Validation ratcheting (on by default since Kubernetes 1.30): an update may leave an invalid part as it
# was (a record stored under an older, looser schema); only what it changes must be valid. Errors of
# these keywords are never ratcheted.
_NOT_RATCHETED = frozenset({"allOf", "anyOf", "oneOf", "not", "x-kubernetes-list-type"})
_MISSING = object()


def _at(value: Any, path: Any) -> Any:
    for part in path:
        try:
            value = value[part]
        except (KeyError, IndexError, TypeError):
            return _MISSING
    return value


def _ratchets(err: ValidationError, old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    if err.validator in _NOT_RATCHETED:
        return False
    path = list(err.absolute_path)  # for `required`, the object that lacks the field
    before = _at(old, path)
    return before is not _MISSING and before == _at(new, path)
