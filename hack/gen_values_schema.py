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
    """The ROOTS and every schema they reference, trimmed, sorted by name."""
    bundled = _bundled(version)
    wanted: dict[str, Any] = {}
    todo = list(ROOTS)
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        wanted[name] = _trim(bundled[name])
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
