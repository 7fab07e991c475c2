"""The targets' schema facts (nodefabric_operator/demo/targets/*.yaml) and a checker that applies them
as the API server would: the openAPIV3Schema by jsonschema, then every x-kubernetes-validations rule by a
CEL evaluator, with oldSelf for an update."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import celpy
import jsonschema

from nodefabric_operator.demo.targets import KAI, KUEUE, KUEUE_V1BETA1_ONLY, VOLCANO, load

__all__ = ["KAI", "KUEUE", "KUEUE_V1BETA1_ONLY", "VOLCANO"]

HOST = "kubernetes.io/hostname"
FABRIC = "feature.gpustack.ai/fabric.domain"
LEAF = "network.topology.nvidia.com/leaf"
SPINE = "network.topology.nvidia.com/spine"
TIER0 = "fabric.topograph.run/tier-0"
TIER1 = "fabric.topograph.run/tier-1"
ZONE = "topology.kubernetes.io/zone"
REGION = "topology.kubernetes.io/region"


def crd(name: str) -> dict[str, Any]:
    return load(name)


def schema_of(crd_doc: Mapping[str, Any], version: str) -> dict[str, Any]:
    for v in crd_doc["spec"]["versions"]:
        if v["name"] == version:
            schema: dict[str, Any] = v["schema"]["openAPIV3Schema"]
            return schema
    raise KeyError(version)


_ENV = celpy.Environment()
_PROGRAMS: dict[str, Any] = {}


def _program(rule: str) -> Any:
    if rule not in _PROGRAMS:
        _PROGRAMS[rule] = _ENV.program(_ENV.compile(rule))
    return _PROGRAMS[rule]


def _cel(schema: Mapping[str, Any], value: Any, old: Any, path: str) -> list[str]:
    errors: list[str] = []
    for v in schema.get("x-kubernetes-validations", ()):
        rule = v["rule"]
        if "oldSelf" in rule and old is None:
            continue  # a transition rule applies to updates only
        binding = {"self": celpy.json_to_cel(value)}
        if old is not None:
            binding["oldSelf"] = celpy.json_to_cel(old)
        result = _program(rule).evaluate(binding)
        if isinstance(result, Exception) or not bool(result):
            errors.append(f"{path}: {v.get('message', rule)}")
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                prior = old.get(key) if isinstance(old, dict) else None
                errors += _cel(sub, value[key], prior, f"{path}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += _cel(schema["items"], item, None, f"{path}[{i}]")
    return errors


def problems(obj: Mapping[str, Any], crd_name: str, old: Mapping[str, Any] | None = None) -> list[str]:
    """Why the API server serving `crd_name` would refuse `obj` (an update of `old` when given)."""
    doc = crd(crd_name)
    group, _, version = str(obj.get("apiVersion", "")).partition("/")
    if group != doc["spec"]["group"] or obj.get("kind") != doc["spec"]["names"]["kind"]:
        return [f"not a {doc['spec']['names']['kind']} of {doc['spec']['group']}"]
    schema = schema_of(doc, version)
    errors = [
        f"{'.'.join(map(str, e.path))}: {e.message}"
        for e in jsonschema.Draft7Validator(schema).iter_errors(obj)
    ]
    return errors + _cel(schema, obj, old, "$")


def labels(**more: str) -> dict[str, str]:
    return dict(more)
