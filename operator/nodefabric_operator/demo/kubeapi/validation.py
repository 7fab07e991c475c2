"""What every API object must satisfy before a real API server stores it: apimachinery's rules.

Object metadata (names, labels, annotations, owner references, finalizers) is checked for every
resource, built-in or custom, with apimachinery's messages, so a write a cluster would refuse is
refused here with the same 422 and the same `details.causes`. Numbers are checked as the API server's
JSON decoder reads them: an integer outside int64 cannot be decoded into a typed field.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from nodefabric_operator.demo.kubeapi.errors import Cause, bad_request

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
LABEL_VALUE_MAX = 63
NAME_PART_MAX = 63
SUBDOMAIN_MAX = 253
ANNOTATIONS_MAX = 256 * 1024

_NAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_VALUE_FMT = f"({_NAME_FMT})?"
_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN_FMT = _LABEL_FMT + "(\\." + _LABEL_FMT + ")*"
# fullmatch, never `^...$`: `$` also matches before a trailing newline, which no label may carry.
_NAME_RE = re.compile(_NAME_FMT)
_VALUE_RE = re.compile(_VALUE_FMT)
_LABEL_RE = re.compile(_LABEL_FMT)
_SUBDOMAIN_RE = re.compile(_SUBDOMAIN_FMT)

_NAME_MSG = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character"
)
_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character"
)
_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character"
)
_DNS_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
    "start and end with an alphanumeric character"
)

# The fields of ObjectMeta: anything else under `metadata` is dropped by the API server's decoder.
OBJECT_META_FIELDS = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    """apimachinery's RegexError, down to its spacing, so messages match a real server's byte for byte."""
    if not examples:
        return f"{msg} (regex used for validation is '{fmt}')"
    text = msg + " (e.g. "
    for i, example in enumerate(examples):
        if i:
            text += " or "
        text += f"'{example}', "
    return text + f"regex used for validation is '{fmt}')"


def _max_len(n: int) -> str:
    return f"must be no more than {n} bytes"


def _syntax_errors(value: str, limit: int, pattern: re.Pattern[str], msg: str, *examples: str) -> list[str]:
    """apimachinery's checks of one syntax: its length in bytes, then its regex."""
    errs = []
    if len(value.encode()) > limit:
        errs.append(_max_len(limit))
    if not pattern.fullmatch(value):
        errs.append(_regex_error(msg, pattern.pattern, *examples))
    return errs


def subdomain_errors(value: str) -> list[str]:
    return _syntax_errors(value, SUBDOMAIN_MAX, _SUBDOMAIN_RE, _SUBDOMAIN_MSG, "example.com")


def dns_label_errors(value: str) -> list[str]:
    return _syntax_errors(value, NAME_PART_MAX, _LABEL_RE, _DNS_LABEL_MSG, "my-name", "123-abc")


def qualified_name_errors(value: str) -> list[str]:
    """IsQualifiedName: label keys, annotation keys, finalizers (`[prefix/]name`)."""
    errs: list[str] = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            errs += ["prefix part " + m for m in subdomain_errors(prefix)]
    else:
        return [
            "a qualified name "
            + _regex_error(_NAME_MSG, _NAME_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name.encode()) > NAME_PART_MAX:
        errs.append("name part " + _max_len(NAME_PART_MAX))
    if not _NAME_RE.fullmatch(name):
        errs.append("name part " + _regex_error(_NAME_MSG, _NAME_FMT, "MyName", "my.name", "123-abc"))
    return errs


def label_value_errors(value: str) -> list[str]:
    return _syntax_errors(value, LABEL_VALUE_MAX, _VALUE_RE, _VALUE_MSG, "MyValue", "my_value", "12345")


def go_value(value: Any) -> str:
    """How `field.Error` prints a bad value: %q for strings, %v for scalars, %#v for the rest."""
    if value is None:
        return '"null"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return _quote(value)
    return _go_composite(value)


def _quote(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{escaped}"'


def _go_composite(value: Any) -> str:
    if isinstance(value, Mapping):
        inner = ", ".join(f"{_quote(str(k))}:{_go_composite(v)}" for k, v in sorted(value.items()))
        return "map[string]interface {}{" + inner + "}"
    if isinstance(value, list):
        return "[]interface {}{" + ", ".join(_go_composite(v) for v in value) + "}"
    if isinstance(value, str):
        return _quote(value)
    if value is None:
        return "interface {}(nil)"
    return go_value(value)


def invalid(field: str, value: Any, detail: str) -> Cause:
    return Cause("FieldValueInvalid", field, f"Invalid value: {go_value(value)}: {detail}")


def required(field: str, detail: str = "") -> Cause:
    return Cause("FieldValueRequired", field, "Required value" + (f": {detail}" if detail else ""))


def forbidden(field: str, detail: str) -> Cause:
    return Cause("FieldValueForbidden", field, f"Forbidden: {detail}")


def too_long(field: str, limit: int) -> Cause:
    return Cause("FieldValueTooLong", field, f"Too long: may not be more than {limit} bytes")


# --- decoding -------------------------------------------------------------------------------------------


def out_of_range_numbers(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Numbers the API server's JSON decoder cannot hold: integers beyond int64, floats beyond float64."""
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            yield path, value
    elif isinstance(value, float):
        if math.isinf(value) or math.isnan(value):
            yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from out_of_range_numbers(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from out_of_range_numbers(item, f"{path}[{i}]")


def check_meta_types(meta: Any) -> None:
    """Wrong JSON types under `metadata` fail decoding into ObjectMeta: 400, as a real server answers."""
    if not isinstance(meta, dict):
        raise bad_request(
            f"json: cannot unmarshal {_json_type(meta)} into Go struct field .metadata of type v1.ObjectMeta"
        )
    for key in ("name", "generateName", "namespace", "uid", "resourceVersion", "creationTimestamp"):
        if key in meta and meta[key] is not None and not isinstance(meta[key], str):
            raise bad_request(
                f"json: cannot unmarshal {_json_type(meta[key])} into Go struct field "
                f"ObjectMeta.metadata.{key} of type string"
            )
    for key in ("labels", "annotations"):
        if key not in meta or meta[key] is None:
            continue
        if not isinstance(meta[key], dict):
            raise bad_request(
                f"json: cannot unmarshal {_json_type(meta[key])} into Go struct field "
                f"ObjectMeta.metadata.{key} of type map[string]string"
            )
        for item in meta[key].values():
            if not isinstance(item, str):
                raise bad_request(
                    f"json: cannot unmarshal {_json_type(item)} into Go struct field "
                    f"ObjectMeta.metadata.{key} of type string"
                )
    for key in ("ownerReferences", "finalizers"):
        if key in meta and meta[key] is not None and not isinstance(meta[key], list):
            raise bad_request(
                f"json: cannot unmarshal {_json_type(meta[key])} into Go struct field "
                f"ObjectMeta.metadata.{key} of type []"
            )
    for ref in meta.get("ownerReferences") or []:
        if not isinstance(ref, dict) or not all(
            isinstance(ref.get(k, ""), str) for k in ("apiVersion", "kind", "name", "uid")
        ):
            raise bad_request(
                "json: cannot unmarshal into Go struct field ObjectMeta.metadata.ownerReferences "
                "of type v1.OwnerReference"
            )
    for item in meta.get("finalizers") or []:
        if not isinstance(item, str):
            raise bad_request(
                f"json: cannot unmarshal {_json_type(item)} into Go struct field "
                "ObjectMeta.metadata.finalizers of type string"
            )


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if value is None:
        return "null"
    return "object"


# --- ObjectMeta -----------------------------------------------------------------------------------------


def labels_causes(labels: Mapping[str, str], field: str = "metadata.labels") -> list[Cause]:
    causes = []
    for key, value in labels.items():
        causes += [invalid(field, key, msg) for msg in qualified_name_errors(key)]
        causes += [invalid(field, value, msg) for msg in label_value_errors(value)]
    return causes


def annotations_causes(annotations: Mapping[str, str], field: str = "metadata.annotations") -> list[Cause]:
    causes = []
    for key in annotations:
        # Annotation keys are qualified names in which case does not matter.
        causes += [invalid(field, key, msg) for msg in qualified_name_errors(key.lower())]
    size = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())
    if size > ANNOTATIONS_MAX:
        causes.append(too_long(field, ANNOTATIONS_MAX))
    return causes


def _mask_trailing_dash(name: str) -> str:
    # apimachinery's quirk, kept: it drops the last two characters, not one, before appending "a".
    return name[:-2] + "a" if len(name) > 1 and name.endswith("-") else name


def meta_causes(
    meta: Mapping[str, Any],
    *,
    dns_label_names: bool = False,
    name_errors: Callable[[str], list[str]] | None = None,
) -> list[Cause]:
    """ValidateObjectMeta: name or generateName, labels, annotations, owner references, finalizers.
    The name's rule is the kind's (`name_errors`; a DNS label where `dns_label_names`, else a subdomain)."""
    check = name_errors or (dns_label_errors if dns_label_names else subdomain_errors)
    causes: list[Cause] = []
    generate = meta.get("generateName") or ""
    if generate:
        causes += [
            invalid("metadata.generateName", generate, m) for m in check(_mask_trailing_dash(generate))
        ]
    name = meta.get("name") or ""
    if not name:
        causes.append(required("metadata.name", "name or generateName is required"))
    else:
        causes += [invalid("metadata.name", name, m) for m in check(name)]
    causes += labels_causes(meta.get("labels") or {})
    causes += annotations_causes(meta.get("annotations") or {})
    controllers = 0
    for ref in meta.get("ownerReferences") or []:
        path = "metadata.ownerReferences"
        api_version = ref.get("apiVersion") or ""
        if not api_version.rpartition("/")[2]:
            causes.append(invalid(f"{path}.apiVersion", api_version, "version must not be empty"))
        if not ref.get("kind"):
            causes.append(invalid(f"{path}.kind", ref.get("kind") or "", "kind must not be empty"))
        if not ref.get("name"):
            causes.append(invalid(f"{path}.name", ref.get("name") or "", "name must not be empty"))
        if not ref.get("uid"):
            causes.append(invalid(f"{path}.uid", ref.get("uid") or "", "uid must not be empty"))
        controllers += bool(ref.get("controller"))
    if controllers > 1:
        causes.append(
            invalid(
                "metadata.ownerReferences",
                meta.get("ownerReferences"),
                "Only one reference can have Controller set to true",
            )
        )
    for item in meta.get("finalizers") or []:
        causes += [invalid("metadata.finalizers", item, m) for m in qualified_name_errors(item)]
    return causes
