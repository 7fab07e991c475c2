"""Label and field selectors with the API server's grammar, its matching rules and its refusals.

Label selectors follow apimachinery's `labels.Parse`: `a=b`, `a==b`, `a!=b`, `a in (x,y)`,
`a notin (x)`, `a`, `!a`, `a>1`, `a<1`; keys and values must have label syntax. Field selectors follow
`fields.ParseSelector` (`=`, `==`, `!=`, backslash escapes) over the fields a resource declares
selectable; any other field is the API server's 400 `field label not supported`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nodefabric_operator.demo.kubeapi.errors import ApiError, bad_request
from nodefabric_operator.demo.kubeapi.validation import label_value_errors, qualified_name_errors


class SelectorError(ValueError):
    pass


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # in, notin, exists, absent, gt, lt
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.op == "in":
            return present and labels[self.key] in self.values
        if self.op == "notin":
            return not present or labels[self.key] not in self.values
        if self.op == "exists":
            return present
        if self.op == "absent":
            return not present
        if not present:
            return False
        try:
            have, want = int(labels[self.key]), int(next(iter(self.values)))
        except ValueError:
            return False
        return have > want if self.op == "gt" else have < want


_SPECIAL = "!=(),<>"


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
        elif text.startswith(("==", "!="), i):
            out.append(text[i : i + 2])
            i += 2
        elif ch in _SPECIAL:
            out.append(ch)
            i += 1
        else:
            j = i
            while j < len(text) and not text[j].isspace() and text[j] not in _SPECIAL:
                j += 1
            out.append(text[i:j])
            i = j
    return out


def _check_key(key: str) -> str:
    errors = qualified_name_errors(key)
    if errors:
        raise SelectorError(f"key: Invalid value: {key!r}: {errors[0]}")
    return key


def _check_value(value: str) -> str:
    errors = label_value_errors(value)
    if errors:
        raise SelectorError(f"values[0]: Invalid value: {value!r}: {errors[0]}")
    return value


class _Parser:
    """apimachinery's label selector grammar, one requirement at a time."""

    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        if self.pos >= len(self.tokens):
            raise SelectorError("found '', expected: identifier")
        self.pos += 1
        return self.tokens[self.pos - 1]

    def requirements(self) -> list[Requirement]:
        reqs = []
        while self.peek() is not None:
            reqs.append(self.requirement())
            if self.peek() is not None and self.take() != ",":
                raise SelectorError(f"found '{self.tokens[self.pos - 1]}', expected: ',' or 'end of string'")
        return reqs

    def requirement(self) -> Requirement:
        negated = self.peek() == "!"
        if negated:
            self.take()
        key = self.take()
        if key in _SPECIAL or key in ("in", "notin", "=", "==", "!="):
            raise SelectorError(f"found '{key}', expected: identifier")
        _check_key(key)
        op = self.peek()
        if negated:
            return Requirement(key, "absent")
        if op is None or op == ",":
            return Requirement(key, "exists")
        self.take()
        if op in ("=", "==", "!="):
            value = "" if self.peek() in (None, ",") else self.take()
            return Requirement(key, "notin" if op == "!=" else "in", frozenset([_check_value(value)]))
        if op in (">", "<"):
            value = self.take()
            if not value.lstrip("-").isdigit():
                raise SelectorError(f"for 'Gt', 'Lt' operators, the value must be an integer: {value!r}")
            return Requirement(key, "gt" if op == ">" else "lt", frozenset([value]))
        if op in ("in", "notin"):
            return Requirement(key, op, frozenset(self.value_set()))
        raise SelectorError(f"found '{op}', expected: in, notin, =, ==, !=, gt, lt")

    def value_set(self) -> list[str]:
        if self.take() != "(":
            raise SelectorError(f"found '{self.tokens[self.pos - 1]}', expected: '('")
        values = []
        while True:
            tok = self.take()
            if tok in (",", ")"):
                raise SelectorError(f"found '{tok}', expected: identifier")
            values.append(_check_value(tok))
            tok = self.take()
            if tok == ")":
                return values
            if tok != ",":
                raise SelectorError(f"found '{tok}', expected: ',' or ')'")


def parse_label_selector(text: str) -> list[Requirement]:
    """Requirements of a label selector, ANDed; SelectorError says what a real server would refuse."""
    return _Parser(text).requirements()


def selector_matches(reqs: Iterable[Requirement], labels: Mapping[str, str]) -> bool:
    return all(r.matches(labels) for r in reqs)


def label_selector(params: Mapping[str, str]) -> list[Requirement]:
    try:
        return parse_label_selector(params.get("labelSelector", ""))
    except SelectorError as err:
        raise bad_request(f"unable to parse requirement: {err}") from None


# --- field selectors ------------------------------------------------------------------------------------

# Fields every resource can be selected by, and the extra ones each built-in resource declares.
GENERIC_FIELDS = frozenset({"metadata.name", "metadata.namespace"})
_ALIASES = {"source": "source.component"}


@dataclass(frozen=True)
class FieldTerm:
    field: str
    value: str
    equal: bool

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return (field_value(obj, self.field) == self.value) is self.equal


def field_value(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in _ALIASES.get(path, path).split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts, current, escaped = [], "", False
    for ch in text:
        if escaped:
            current += ch
            escaped = False
        elif ch == "\\":
            current += ch
            escaped = True
        elif ch == sep:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return parts


def _unescape(text: str) -> str:
    out, escaped = "", False
    for ch in text:
        if escaped:
            if ch not in "\\,=!":
                raise SelectorError(f"invalid field selector: invalid escape sequence \\{ch}")
            out += ch
            escaped = False
        elif ch == "\\":
            escaped = True
        else:
            out += ch
    if escaped:
        raise SelectorError("invalid field selector: unterminated escape sequence")
    return out


def parse_field_selector(text: str, selectable: frozenset[str]) -> list[FieldTerm]:
    """Terms of a field selector over `selectable` fields; an unsupported field is a 400, as upstream."""
    terms = []
    for raw in _split_unescaped(text, ","):
        if not raw.strip():
            continue
        found = [(i, op) for op in ("!=", "==", "=") if (i := _find_unescaped(raw, op)) >= 0]
        if not found:
            raise SelectorError(f"invalid selector: '{raw}'; can't understand '{raw}'")
        index, op = min(found, key=lambda f: (f[0], -len(f[1])))
        key = _unescape(raw[:index].strip())
        if key not in selectable:
            raise SelectorError(f"field label not supported: {key}")
        terms.append(FieldTerm(key, _unescape(raw[index + len(op) :]), op != "!="))
    return terms


def _find_unescaped(text: str, op: str) -> int:
    escaped = False
    for i, ch in enumerate(text):
        if escaped:
            escaped = False
            continue
        if ch == "\\":
            escaped = True
            continue
        if text.startswith(op, i):
            return i
    return -1


def field_selector(params: Mapping[str, str], selectable: frozenset[str]) -> list[FieldTerm]:
    try:
        return parse_field_selector(params.get("fieldSelector", ""), selectable)
    except SelectorError as err:
        raise ApiError(400, "BadRequest", str(err), {}) from None


_OBJECT_OPERATORS = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "absent"}


def object_selector(selector: object) -> list[Requirement]:
    """A `metav1.LabelSelector` object (matchLabels, matchExpressions), as requirements; None or {} selects
    everything. SelectorError names what a real API server refuses in it."""
    if selector is None:
        return []
    if not isinstance(selector, Mapping):
        raise SelectorError(f"a label selector must be an object, got {type(selector).__name__}")
    out: list[Requirement] = []
    labels = selector.get("matchLabels") or {}
    if not isinstance(labels, Mapping):
        raise SelectorError("matchLabels must be an object")
    for key, value in labels.items():
        if not isinstance(value, str):
            raise SelectorError(f"matchLabels[{key!r}] must be a string")
        out.append(Requirement(_check_key(str(key)), "in", frozenset({_check_value(value)})))
    expressions = selector.get("matchExpressions") or []
    if not isinstance(expressions, list):
        raise SelectorError("matchExpressions must be a list")
    for i, expr in enumerate(expressions):
        if not isinstance(expr, Mapping):
            raise SelectorError(f"matchExpressions[{i}] must be an object")
        op = _OBJECT_OPERATORS.get(str(expr.get("operator")))
        values = expr.get("values") or []
        if op is None:
            raise SelectorError(
                f"matchExpressions[{i}].operator: {expr.get('operator')!r} is not a valid operator"
            )
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise SelectorError(f"matchExpressions[{i}].values must be a list of strings")
        if (op in ("in", "notin")) != bool(values):
            raise SelectorError(
                f"matchExpressions[{i}].values: must be non-empty for In and NotIn and empty otherwise"
            )
        key = _check_key(str(expr.get("key", "")))
        out.append(Requirement(key, op, frozenset(_check_value(v) for v in values)))
    return out
