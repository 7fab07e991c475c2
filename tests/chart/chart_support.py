"""Helpers shared by the chart tests: paths, helm invocation and small queries over rendered manifests."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from nodefabric_operator.demo.kubeapi.naming import object_causes

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "nodefabric"
NAMESPACE = "nodefabric"
RELEASE = "nf"
# A recent version that kubernetes-validate bundles schemas for, and the chart's kubeVersion admits.
KUBE_VERSION = "1.33.0"

Doc = dict[str, Any]


# libyaml's parser when PyYAML has it: a render with its CRDs is ~110 KB, 0.3 s in pure Python and 20 times
# less in C, paid twice per render (the check below and the render fixture). Same SafeConstructor either way.
_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_docs(text: str) -> list[Doc]:
    """The YAML documents of helm's output (`---` separated), empty ones left out."""
    return [d for d in yaml.load_all(text, Loader=_LOADER) if d]


class RenderError(Exception):
    """helm refused the chart or the values; the message is helm's stderr."""


def scheduler_tag(kube_version: str) -> str:
    """The kube-scheduler tag an operator sets for a cluster of this version (v1.32.9-eks-1 -> v1.32.9)."""
    found = re.match(r"v?(\d+\.\d+\.\d+)", kube_version)
    assert found, kube_version
    return f"v{found.group(1)}"


def run_helm(
    helm: Path,
    *args: str,
    values: dict[str, Any] | None,
    tmp: Path,
    kube_version: str | None = KUBE_VERSION,
) -> subprocess.CompletedProcess[str]:
    """helm with the test's values after the one value an install needs for its cluster, the kube-scheduler
    tag of `kube_version` (None: the chart's values.yaml alone)."""
    cmd = [str(helm), *args]
    if kube_version is not None:
        cf = tmp / "cluster.yaml"
        cf.write_text(yaml.safe_dump({"scheduler": {"image": {"tag": scheduler_tag(kube_version)}}}))
        cmd += ["-f", str(cf)]
    if values is not None:
        vf = tmp / "values.yaml"
        vf.write_text(yaml.safe_dump(values))
        cmd += ["-f", str(vf)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60)
    if args and args[0] == "template" and done.returncode == 0:
        check_render(parse_docs(done.stdout))
    return done


# Every successful `helm template` of the chart tests passes through check_render (from run_helm, which
# the render fixture uses too): the count lets a test prove the hook is on the path.
RENDERS_CHECKED = [0]


class ApiRefusal(AssertionError):
    """A render holds an object a real API server would refuse, or a reference it would accept but that
    breaks the pod (a probe or targetPort naming no container port)."""


def api_refusals(docs: list[Doc]) -> list[str]:
    """What a real API server would refuse in these manifests: the embedded API's own naming rules
    (nodefabric_operator.demo.kubeapi.naming), one line per cause, "Kind name: field: message"."""
    out = []
    for d in docs:
        name = (d.get("metadata") or {}).get("name") if isinstance(d.get("metadata"), dict) else None
        out += [f"{d.get('kind')} {name}: {c.text()}" for c in object_causes(d)]
    return out + dangling_ports(docs)


def _named_ports(template: dict[str, Any]) -> set[str]:
    spec = template.get("spec") or {}
    return {
        p["name"]
        for c in (spec.get("containers") or []) + (spec.get("initContainers") or [])
        for p in c.get("ports") or []
        if p.get("name")
    }


def dangling_ports(docs: list[Doc]) -> list[str]:
    """Port names the API server accepts but nothing answers on: a named probe port its container does
    not declare (the probe fails for ever), a Service's targetPort no pod it selects declares (no
    endpoints). A Service whose pods are not in this render (`helm template -s`) is not judged."""
    out = []
    templates = [(d, d["spec"]["template"]) for d in workloads(docs) if "template" in d.get("spec", {})]
    for d, template in templates:
        for c in template["spec"].get("containers") or []:
            own = {p.get("name") for p in c.get("ports") or []}
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                for handler in ("httpGet", "tcpSocket"):
                    port = ((c.get(probe) or {}).get(handler) or {}).get("port")
                    if isinstance(port, str) and port not in own:
                        out.append(
                            f"{d['kind']} {d['metadata']['name']}: container {c.get('name')}: "
                            f"{probe}.{handler}.port {port!r} is no port of the container"
                        )
    for svc in of_kind(docs, "Service"):
        selector = svc["spec"].get("selector") or {}
        selected = [
            t
            for _, t in templates
            if selector and selector.items() <= (t["metadata"].get("labels") or {}).items()
        ]
        if not selected:
            continue
        declared = set().union(*(_named_ports(t) for t in selected))
        for port in svc["spec"].get("ports") or []:
            target = port.get("targetPort")
            if isinstance(target, str) and target not in declared:
                out.append(
                    f"Service {svc['metadata']['name']}: targetPort {target!r} is no port of the pods it "
                    f"selects ({sorted(declared)})"
                )
    return out + _dangling_monitors(docs)


def _dangling_monitors(docs: list[Doc]) -> list[str]:
    """A ServiceMonitor that selects no Service of the render, or scrapes a port name none of them has:
    Prometheus then has nothing to scrape, and nothing says so."""
    services = of_kind(docs, "Service")
    if not services:
        return []
    out = []
    for monitor in of_kind(docs, "ServiceMonitor"):
        name = monitor["metadata"]["name"]
        match = (monitor["spec"].get("selector") or {}).get("matchLabels") or {}
        selected = [s for s in services if match.items() <= (s["metadata"].get("labels") or {}).items()]
        if not selected:
            out.append(f"ServiceMonitor {name}: selects no Service ({match})")
            continue
        ports = {p.get("name") for s in selected for p in s["spec"].get("ports") or []}
        for endpoint in monitor["spec"].get("endpoints") or []:
            if isinstance(endpoint.get("port"), str) and endpoint["port"] not in ports:
                out.append(f"ServiceMonitor {name}: port {endpoint['port']!r} is no port of {sorted(ports)}")
    return out


def check_render(docs: list[Doc]) -> None:
    RENDERS_CHECKED[0] += 1
    refused = api_refusals(docs)
    if refused:
        raise ApiRefusal(
            "a real API server would refuse (or never serve) this render:\n" + "\n".join(refused)
        )


def of_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def workloads(docs: list[Doc]) -> Iterator[Doc]:
    yield from (d for d in docs if d["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job"))


def pod_spec(workload: Doc) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def container(workload: Doc, name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in pod_spec(workload)["containers"] if c["name"] == name]
    assert len(found) == 1, f"no container {name} in {workload['metadata']['name']}"
    return found[0]


def configmap_yaml(docs: list[Doc], name: str, key: str) -> Any:
    return yaml.safe_load(one(docs, "ConfigMap", name)["data"][key])


def refusal(render: Callable[..., list[Doc]], values: dict[str, Any]) -> str:
    """What helm says when it refuses to render these values; fails the test when it renders them."""
    try:
        render(values)
    except RenderError as refused:
        return str(refused)
    raise AssertionError(f"helm rendered values it should refuse: {values}")


def load_hack(name: str) -> ModuleType:
    """A script of hack/ as a module (they are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "hack" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


NODE_CLAIM = "authentication.kubernetes.io/node-name"


def user_info(username: str, node_claim: list[str] | None = None) -> dict[str, Any]:
    """request.userInfo of a service account, with the node claim a pod-bound token carries (None: none)."""
    info: dict[str, Any] = {"username": username}
    if node_claim is not None:
        info["extra"] = {NODE_CLAIM: node_claim}
    return info


class CelPolicy:
    """Evaluates a rendered ValidatingAdmissionPolicy the way the API server does for one request: its
    matchConditions, then its variables in order (each may read those before it), then its validations;
    the message of the first that fails (messageExpression, else message). cel-python, not the API
    server's CEL: a test skips where it is not installed."""

    def __init__(self, policy: dict[str, Any]) -> None:
        import pytest

        self.celpy = pytest.importorskip(
            "celpy", reason="cel-python is not installed: the policy's CEL is not evaluated"
        )
        self.env = self.celpy.Environment()
        self.spec = policy["spec"]

    def _eval(self, expr: str, activation: dict[str, Any]) -> Any:
        return self.env.program(self.env.compile(expr)).evaluate(activation)

    def admit(
        self, request: dict[str, Any], new: dict[str, Any] | None = None, old: dict[str, Any] | None = None
    ) -> tuple[bool, str]:
        """(allowed, why): "not matched", "allowed", or the refusal's message."""
        activation: dict[str, Any] = {
            "request": self.celpy.json_to_cel(request),
            "object": self.celpy.json_to_cel(new),
            "oldObject": self.celpy.json_to_cel(old),
        }
        if not all(
            bool(self._eval(c["expression"], activation)) for c in self.spec.get("matchConditions", [])
        ):
            return True, "not matched"
        celtypes = self.celpy.celtypes
        variables = celtypes.MapType()
        for v in self.spec.get("variables", []):
            activation["variables"] = variables
            variables = celtypes.MapType(
                {**variables, celtypes.StringType(v["name"]): self._eval(v["expression"], activation)}
            )
        activation["variables"] = variables
        for v in self.spec["validations"]:
            if not bool(self._eval(v["expression"], activation)):
                if "messageExpression" in v:
                    return False, str(self._eval(v["messageExpression"], activation))
                return False, str(v["message"])
        return True, "allowed"
