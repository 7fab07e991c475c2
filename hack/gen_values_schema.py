#!/usr/bin/env python3
"""Refresh the Kubernetes object schemas inside charts/nodefabric/values.schema.json.

Values that pass straight into a pod (securityContext, affinity, tolerations, extraEnv, extraVolumes,
extraVolumeMounts, resources) are checked against Kubernetes' own schemas, so a typo in one of them fails
`helm install` with the key named instead of being dropped by the API server. The schemas come from
kubernetes-validate's bundled strict (additionalProperties: false) OpenAPI schemas of one Kubernetes
version, trimmed to what validation needs, under the file's top-level "definitions". Everything else in the
file, the chart's own shared definitions included, is written by hand and kept byte for byte; a test fails
when the Kubernetes definitions are stale.

    python hack/gen_values_schema.py          # rewrite the file
    python hack/gen_values_schema.py --check  # exit 1 when it is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "charts" / "nodefabric" / "values.schema.json"
# The newest Kubernetes release the chart is tested against (tests/chart/chart_support.py KUBE_VERSION):
# a field newer clusters add is refused until this moves, a field older clusters lack is the API server's
# to refuse.
KUBE_VERSION = "1.33.0"
ROOTS = (
    "io.k8s.api.core.v1.Affinity",
    "io.k8s.api.core.v1.EnvVar",
    "io.k8s.api.core.v1.PodSecurityContext",
    "io.k8s.api.core.v1.ResourceRequirements",
    "io.k8s.api.core.v1.SecurityContext",
    "io.k8s.api.core.v1.Toleration",
    "io.k8s.api.core.v1.TopologySpreadConstraint",
    "io.k8s.api.networking.v1.NetworkPolicyPeer",
    "io.k8s.api.core.v1.Volume",
    "io.k8s.api.core.v1.VolumeMount",
)
# What the API server's Go validation refuses beyond the OpenAPI types (pkg/apis/core/validation and
# apimachinery's), per definition, added to it as "allOf": a value the schema takes then renders a pod the
# API server takes. The types say only "string" for a toleration's operator or a quantity, so without these
# a typo there fails mid-install, on the DaemonSet or Deployment, after helm has created other objects.
_QUALIFIED = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_LABEL_KEY = {"type": "string", "maxLength": 317, "pattern": _QUALIFIED}
_LABEL_VALUE = {
    "type": "string",
    "maxLength": 63,
    "pattern": r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$",
}
_EMPTY = {"enum": ["", None]}
_ID = {"type": "integer", "minimum": 0, "maximum": 2147483647}
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_CIDR = {
    "type": "string",
    "anyOf": [
        {"pattern": rf"^({_OCTET}\.){{3}}{_OCTET}/(3[0-2]|[12]?[0-9])$"},
        {"pattern": r"^[0-9a-fA-F:.]*:[0-9a-fA-F:.]*/(12[0-8]|1[01][0-9]|[1-9]?[0-9])$"},
    ],
}

_BACKSTEP = r"(^|/)\.\.(/|$)"
# A path below another: relative, no '..' element.
_DESCENDING = {"not": {"type": "string", "anyOf": [{"pattern": "^/"}, {"pattern": _BACKSTEP}]}}
_MODE = {"type": "integer", "minimum": 0, "maximum": 511}


def _when(field: str, values: list[Any], then: dict[str, Any]) -> dict[str, Any]:
    return {"if": {"required": [field], "properties": {field: {"enum": values}}}, "then": then}


def _profile() -> dict[str, Any]:
    """seccompProfile and appArmorProfile: a known type; a localhostProfile with Localhost and only then."""
    return {
        "properties": {"type": {"enum": ["RuntimeDefault", "Unconfined", "Localhost"]}},
        "if": {"properties": {"type": {"const": "Localhost"}}},
        "then": {"required": ["localhostProfile"], "properties": {"localhostProfile": {"minLength": 1}}},
        "else": {"properties": {"localhostProfile": _EMPTY}},
    }


def _selector_requirement(operators: list[str], ranged: list[str], value: dict[str, Any]) -> dict[str, Any]:
    """A selector requirement: a label key, a known operator, values for In and NotIn, none for Exists and
    DoesNotExist, one for Gt and Lt (nodes only)."""
    return {
        "properties": {"key": _LABEL_KEY, "operator": {"enum": operators}, "values": {"items": value}},
        "allOf": [
            _when(
                "operator",
                ["In", "NotIn"],
                {"required": ["values"], "properties": {"values": {"minItems": 1}}},
            ),
            _when("operator", ["Exists", "DoesNotExist"], {"properties": {"values": {"maxItems": 0}}}),
            *(
                [_when("operator", ranged, {"properties": {"values": {"minItems": 1, "maxItems": 1}}})]
                if ranged
                else []
            ),
        ],
    }


API_RULES: dict[str, dict[str, Any]] = {
    "io.k8s.apimachinery.pkg.api.resource.Quantity": {
        # resource.ParseQuantity's syntax, never negative (every quantity of a pod must be >= 0).
        "anyOf": [
            {"type": "null"},
            {"type": "number", "minimum": 0},
            {
                "type": "string",
                "pattern": r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][-+]?[0-9]+)?$",
            },
        ]
    },
    "io.k8s.api.core.v1.Toleration": {
        "properties": {
            "key": {"anyOf": [_EMPTY, _LABEL_KEY]},
            "operator": {"enum": ["", "Equal", "Exists", None]},
            "effect": {"enum": ["", "NoSchedule", "PreferNoSchedule", "NoExecute", None]},
        },
        "allOf": [
            # An empty key matches every taint, which only Exists says.
            {
                "if": {
                    "not": {"required": ["key"], "properties": {"key": {"type": "string", "minLength": 1}}}
                },
                "then": {"required": ["operator"], "properties": {"operator": {"const": "Exists"}}},
            },
            {
                "if": {"required": ["operator"], "properties": {"operator": {"const": "Exists"}}},
                "then": {"properties": {"value": _EMPTY}},
                "else": {"properties": {"value": _LABEL_VALUE}},
            },
            {
                "if": {
                    "required": ["tolerationSeconds"],
                    "properties": {"tolerationSeconds": {"type": "integer"}},
                },
                "then": {"required": ["effect"], "properties": {"effect": {"const": "NoExecute"}}},
            },
        ],
    },
    "io.k8s.api.core.v1.EnvVar": {
        # IsEnvVarName, strict as Kubernetes 1.30 and 1.31 have it; a value beside valueFrom is refused.
        "properties": {
            "name": {
                "pattern": r"^[-._a-zA-Z][-._a-zA-Z0-9]*$",
                "not": {"type": "string", "pattern": r"^\.(\.|$)"},
            }
        },
        "if": {"required": ["valueFrom"], "properties": {"valueFrom": {"type": "object"}}},
        "then": {"properties": {"value": _EMPTY}},
    },
    # Exactly one source.
    "io.k8s.api.core.v1.EnvVarSource": {"minProperties": 1, "maxProperties": 1},
    # A DNS label; the name and at most one source (none is an emptyDir).
    "io.k8s.api.core.v1.Volume": {
        "properties": {"name": {"maxLength": 63, "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}},
        "maxProperties": 2,
    },
    "io.k8s.api.core.v1.NodeSelectorRequirement": _selector_requirement(
        ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"], ["Gt", "Lt"], {"type": "string"}
    ),
    # matchFields can only name the node: metadata.name, In or NotIn, one value.
    "io.k8s.api.core.v1.NodeSelectorTerm": {
        "properties": {
            "matchFields": {
                "items": {
                    "properties": {
                        "key": {"const": "metadata.name"},
                        "operator": {"enum": ["In", "NotIn"]},
                        "values": {"minItems": 1, "maxItems": 1},
                    }
                }
            }
        }
    },
    "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelectorRequirement": _selector_requirement(
        ["In", "NotIn", "Exists", "DoesNotExist"], [], _LABEL_VALUE
    ),
    "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector": {
        "properties": {"matchLabels": {"propertyNames": _LABEL_KEY, "additionalProperties": _LABEL_VALUE}}
    },
    "io.k8s.api.core.v1.PodAffinityTerm": {"properties": {"topologyKey": _LABEL_KEY}},
    "io.k8s.api.core.v1.TopologySpreadConstraint": {"properties": {"topologyKey": _LABEL_KEY}},
    "io.k8s.api.core.v1.SeccompProfile": _profile(),
    "io.k8s.api.core.v1.AppArmorProfile": _profile(),
    "io.k8s.api.core.v1.Sysctl": {
        "properties": {
            "name": {
                "maxLength": 253,
                "pattern": r"^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?$",
            }
        }
    },
    "io.k8s.api.core.v1.SecurityContext": {"properties": {"runAsUser": _ID, "runAsGroup": _ID}},
    "io.k8s.api.core.v1.PodSecurityContext": {
        "properties": {
            "runAsUser": _ID,
            "runAsGroup": _ID,
            "fsGroup": _ID,
            "supplementalGroups": {"items": _ID},
        }
    },
    # A peer names something, and an ipBlock stands alone.
    "io.k8s.api.networking.v1.NetworkPolicyPeer": {
        "minProperties": 1,
        "if": {"required": ["ipBlock"]},
        "then": {"maxProperties": 1},
    },
    "io.k8s.api.networking.v1.IPBlock": {"properties": {"cidr": _CIDR, "except": {"items": _CIDR}}},
    "io.k8s.api.core.v1.HostPathVolumeSource": {
        "properties": {
            "path": {"minLength": 1, "not": {"type": "string", "pattern": _BACKSTEP}},
            "type": {
                "enum": [
                    *("", "DirectoryOrCreate", "Directory", "FileOrCreate", "File"),
                    *("Socket", "CharDevice", "BlockDevice", None),
                ]
            },
        }
    },
    "io.k8s.api.core.v1.VolumeMount": {
        "properties": {
            "mountPath": {"minLength": 1},
            "mountPropagation": {"enum": ["None", "HostToContainer", "Bidirectional", None]},
            "subPath": _DESCENDING,
        }
    },
    # A file of a configMap, secret or downwardAPI volume: below the mount, mode 0 to 0777.
    "io.k8s.api.core.v1.KeyToPath": {"properties": {"path": {"minLength": 1, **_DESCENDING}, "mode": _MODE}},
    "io.k8s.api.core.v1.ConfigMapVolumeSource": {"properties": {"defaultMode": _MODE}},
    "io.k8s.api.core.v1.SecretVolumeSource": {"properties": {"defaultMode": _MODE}},
    # A claim must name one of the pod's resourceClaims, and the chart's pods have none.
    "io.k8s.api.core.v1.ResourceRequirements": {"properties": {"claims": {"maxItems": 0}}},
}
# Keywords that validate; descriptions, formats and x-kubernetes-* annotations are dropped (the file stays
# small, and helm's validator need not know Kubernetes' format names).
KEEP = {"type", "properties", "items", "additionalProperties", "required", "enum", "oneOf", "anyOf", "$ref"}


def _bundled(version: str) -> dict[str, Any]:
    path = (
        Path(kubernetes_validate.__file__).parent
        / "kubernetes-json-schema"
        / f"v{version}-local-strict"
        / "_definitions.json"
    )
    if not path.is_file():
        raise SystemExit(f"kubernetes-validate bundles no strict schemas for Kubernetes {version} ({path})")
    defs: dict[str, Any] = json.loads(path.read_text())["$defs"]
    return defs


def _trim(node: Any) -> Any:
    if isinstance(node, list):
        return [_trim(n) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key not in KEEP:
            continue
        if key == "$ref":
            out[key] = "#/definitions/" + value.rsplit("/", 1)[-1]
        elif key == "properties":
            out[key] = {name: _trim(sub) for name, sub in value.items()}
        else:
            out[key] = _trim(value)
    return out


def _refs(node: Any) -> list[str]:
    if isinstance(node, list):
        return [r for n in node for r in _refs(n)]
    if not isinstance(node, dict):
        return []
    found = [node["$ref"].rsplit("/", 1)[-1]] if "$ref" in node else []
    return found + [r for key, value in node.items() if key != "$ref" for r in _refs(value)]


def definitions(version: str = KUBE_VERSION) -> dict[str, Any]:
    """The ROOTS and every schema they reference, trimmed, with their API_RULES, sorted by name."""
    bundled = _bundled(version)
    wanted: dict[str, Any] = {}
    todo = list(ROOTS)
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        wanted[name] = _trim(bundled[name])
        if name in API_RULES:
            wanted[name]["allOf"] = [API_RULES[name]]
        todo.extend(_refs(wanted[name]))
    return dict(sorted(wanted.items()))


def render(text: str) -> str:
    """The schema file's text with fresh Kubernetes definitions; the chart's own definitions (names not
    starting with io.k8s.) and everything else as they were."""
    schema = json.loads(text)
    own = {k: v for k, v in schema.get("definitions", {}).items() if not k.startswith("io.k8s.")}
    schema["definitions"] = dict(sorted({**own, **definitions()}.items()))
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the file is stale; write nothing")
    args = parser.parse_args()
    current = SCHEMA.read_text()
    fresh = render(current)
    if args.check:
        if fresh != current:
            stale = SCHEMA.relative_to(ROOT)
            print(f"{stale} is stale: run python hack/gen_values_schema.py", file=sys.stderr)
            return 1
        return 0
    SCHEMA.write_text(fresh)
    print(f"wrote {SCHEMA.relative_to(ROOT)} (Kubernetes {KUBE_VERSION} object schemas)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
