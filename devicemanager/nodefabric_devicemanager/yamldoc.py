"""YAML documents from files a person hands us (a record, a kubeconfig, the extender's configuration or
nodes file): `yaml.safe_load`, then a refusal of alias bombs.

The loader shares an aliased value instead of copying it, so a 1 KB file of nested aliases (a "billion
laughs") loads at once and then hangs whatever walks it (validation, for ever). Counting the values
with every alias expanded, up to a limit far above any real document, refuses it first.
"""

from __future__ import annotations

from typing import Any

import yaml

from nodefabric_devicemanager.models import Devices

MAX_VALUES = 2_000_000  # values once aliases are expanded; a 3 MiB record has ~300k


def expanded_size(doc: Any, limit: int = MAX_VALUES) -> int:
    """How many values `doc` holds with every alias expanded; ValueError beyond `limit`."""
    count, stack = 0, [doc]
    while stack:
        node = stack.pop()
        count += 1
        if count > limit:
            raise ValueError(
                f"the document expands to more than {limit:,} values (every YAML alias expanded)"
            )
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return count


NESTED_TOO_DEEP = "the document is nested too deep (a list or mapping in another, thousands of times)"


def load(text: str) -> Any:
    """One YAML (or JSON) document; yaml.YAMLError when it does not parse, ValueError for a bomb or a
    document nested too deep for the loader (it recurses once per level: RecursionError)."""
    try:
        doc: Any = yaml.safe_load(text)
    except RecursionError:
        raise ValueError(NESTED_TOO_DEEP) from None
    expanded_size(doc)
    return doc


def load_devices(text: str) -> Devices:
    """A Devices object from JSON or YAML text (YAML is a superset of JSON)."""
    doc = load(text)
    if not isinstance(doc, dict):
        raise ValueError("expected one Devices object (a mapping), got " + type(doc).__name__)
    if doc.get("kind") not in (None, "Devices"):
        raise ValueError(f"expected kind Devices, got {doc.get('kind')!r}")
    return Devices.from_wire(doc)
