"""values.schema.json is strict and complete: every object refuses unknown keys, every key it declares is
documented in values.yaml, and the Kubernetes object schemas inside it are the generated ones."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import yaml
from chart_support import CHART, load_hack

SCHEMA: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
VALUES: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
# Declared for Helm's own use (subcharts' globals), never set by this chart.
# Declared for Helm's own use (subcharts' globals), never set by this chart; issuerRef: empty by default
# (a self-signed Issuer), its keys documented in its comment.
NOT_IN_VALUES = {"global", "placement.webhook.certManager.issuerRef"}
# Kubernetes objects (and probe timings, and the kube-scheduler profile) passed on as given; their optional
# fields need no default.
KUBERNETES_OBJECTS = {"resources", "livenessProbe", "readinessProbe", "profile"}


def resolve(node: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The schema a node refers to, and whether it is one of Kubernetes' (generated, not ours)."""
    kubernetes = False
    while "$ref" in node:
        name = node["$ref"].removeprefix("#/definitions/")
        kubernetes = kubernetes or name.startswith("io.k8s.")
        node = SCHEMA["definitions"][name]
    return node, kubernetes


def objects(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every object schema of the chart's own values (not inside Kubernetes' schemas), with its path."""
    node, kubernetes = resolve(node)
    if "properties" in node and not kubernetes:
        yield path, node
        for name, sub in node["properties"].items():
            if name not in KUBERNETES_OBJECTS:
                yield from objects(sub, f"{path}.{name}" if path else name)


def test_the_kubernetes_schemas_are_the_generated_ones() -> None:
    text = (CHART / "values.schema.json").read_text()
    assert load_hack("gen_values_schema").render(text) == text, "stale: run python hack/gen_values_schema.py"


def test_every_reference_resolves() -> None:
    def refs(node: Any) -> Iterator[str]:
        if isinstance(node, dict):
            if "$ref" in node:
                yield node["$ref"]
            for value in node.values():
                yield from refs(value)
        elif isinstance(node, list):
            for value in node:
                yield from refs(value)

    found = set(refs(SCHEMA))
    assert found
    for ref in found:
        assert (
            ref.startswith("#/definitions/") and ref.removeprefix("#/definitions/") in SCHEMA["definitions"]
        )


def test_every_object_refuses_unknown_keys() -> None:
    open_objects = [
        path for path, node in objects(SCHEMA) if node.get("additionalProperties", True) is not False
    ]
    assert open_objects == []


def test_every_declared_key_is_in_values_yaml() -> None:
    """A key the schema allows but values.yaml lacks is undocumented (and has no default to read)."""
    missing = []
    for path, node in objects(SCHEMA):
        here: Any = VALUES
        for part in [p for p in path.split(".") if p]:
            here = here.get(part, {}) if isinstance(here, dict) else {}
        for name in node["properties"]:
            if (path or name) in NOT_IN_VALUES:
                continue
            if not isinstance(here, dict) or name not in here:
                missing.append(f"{path}.{name}" if path else name)
    assert missing == []


def test_the_kubernetes_schemas_refuse_unknown_fields() -> None:
    for name in (
        "io.k8s.api.core.v1.SecurityContext",
        "io.k8s.api.core.v1.Volume",
        "io.k8s.api.core.v1.Toleration",
    ):
        assert SCHEMA["definitions"][name]["additionalProperties"] is False, name
