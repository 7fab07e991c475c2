"""Every nodefabric command line the chart renders parses with the real `nodefabric` parser (a flag the
program does not know, or a value it refuses, fails here), and every HTTP probe the chart wires points at
a port and a path the command will serve by those flags. Across the chart's variants: DRA on (with and
without the device plugin), the extender on, another label sink and domain."""

from __future__ import annotations

from typing import Any

import pytest
from chart_support import Doc

from nodefabric_devicemanager.shell.flags import listen
from nodefabric_operator.console import build_parser

VARIANTS = [
    {},
    {"dra": {"enabled": True}},
    {"dra": {"enabled": True, "devicePlugin": True}},
    {"extender": {"enabled": True}, "labelSink": "node", "domain": "example.com"},
]
# What kubelet substitutes from the downward API.
ENV = {"$(NODE_NAME)": "gpu-node-7", "$(HOST_IP)": "10.0.0.7", "$(POD_NAMESPACE)": "nodefabric"}
SERVING = ("agent", "deviceplugin", "draplugin", "operator", "extender", "placement")


def _pod_specs(doc: Doc) -> list[dict[str, Any]]:
    spec = doc.get("spec") or {}
    template = (spec.get("template") or (spec.get("jobTemplate") or {}).get("spec", {}).get("template")) or {}
    return [template["spec"]] if template.get("spec") else []


def _our_containers(docs: list[Doc]) -> list[tuple[str, dict[str, Any], list[str]]]:
    """(where, container, its command line after `nodefabric`) for every container running nodefabric."""
    found = []
    for doc in docs:
        for pod in _pod_specs(doc):
            for c in pod.get("containers", []) + pod.get("initContainers", []):
                line = [str(a) for a in (c.get("command") or []) + (c.get("args") or [])]
                if "nodefabric" not in str(c.get("image", "")) and not (
                    line and line[0].endswith("nodefabric")
                ):
                    continue
                if line and line[0].endswith("nodefabric"):
                    line = line[1:]
                for var, value in ENV.items():
                    line = [a.replace(var, value) for a in line]
                found.append((f"{doc['kind']} {doc['metadata']['name']} {c['name']}", c, line))
    return found


def _parse(where: str, line: list[str]) -> Any:
    parser, command = build_parser(line)
    assert command is not None, (where, line)
    try:
        return parser.parse_args(line)
    except SystemExit as exc:
        pytest.fail(f"{where}: `nodefabric {' '.join(line)}` does not parse (exit {exc.code})")


@pytest.mark.parametrize("values", VARIANTS, ids=lambda v: ",".join(v) or "default")
def test_every_rendered_command_line_parses_and_its_probes_point_at_what_it_serves(render, values) -> None:
    containers = _our_containers(render(values, kube_version="1.34.0"))  # DRA needs resource.k8s.io/v1
    commands = set()
    for where, container, line in containers:
        ns = _parse(where, line)
        commands.add(ns.command)
        if ns.command not in SERVING or (ns.command == "operator" and getattr(ns, "prune", False)):
            continue
        served = listen(ns)
        ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
        for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
            get = (container.get(kind) or {}).get("httpGet")
            if not get:
                continue
            port = ports.get(get["port"], get["port"])
            assert port == served.health_port, (where, kind, port, served)
            assert get["path"] in ("/healthz", "/readyz"), (where, kind, get["path"])
        if "metrics" in ports:
            assert ports["metrics"] == served.metrics_port, (where, ports, served)
    # The variants' commands are all there: nothing silently dropped from the walk.
    assert {"agent", "operator", "placement", "crd"} <= commands, commands
    if values.get("extender"):
        assert "extender" in commands
