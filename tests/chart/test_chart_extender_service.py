"""extender.mode=service: the extender alone, as its own Deployment and ServiceAccount behind a Service
with TLS and client certificates, for a kube-scheduler you run; and the README's snippet for that
scheduler names what this mode renders."""

from __future__ import annotations

import base64
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_support import NAMESPACE, ROOT, CelPolicy, Doc, container, of_kind, one, pod_spec
from test_chart_validate import validate_all

EXTENDER = "nf-nodefabric-extender"
SERVICE_MODE = {"extender": {"enabled": True, "mode": "service"}}


@pytest.fixture(scope="module")
def docs(render) -> list[Doc]:  # type: ignore[no-untyped-def]
    return render(SERVICE_MODE)


def parse(args: list[str]) -> Any:
    from nodefabric_operator.console import build_parser

    parser, command = build_parser(args)
    assert command is not None, args
    return parser.parse_args(args)


def test_service_mode_runs_no_second_scheduler_and_is_valid(docs: list[Doc]) -> None:
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert not [n for _, n in names if "scheduler" in n]
    assert ("Deployment", EXTENDER) in names and ("Service", EXTENDER) in names
    validate_all(docs)


def test_the_extender_runs_as_its_own_account(docs: list[Doc]) -> None:
    d = one(docs, "Deployment", EXTENDER)
    assert pod_spec(d)["serviceAccountName"] == EXTENDER
    assert one(docs, "ServiceAccount", EXTENDER)
    (binding,) = [b for b in of_kind(docs, "ClusterRoleBinding") if b["roleRef"]["name"] == EXTENDER]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": EXTENDER, "namespace": NAMESPACE}]
    policy = one(docs, "ValidatingAdmissionPolicy", f"{EXTENDER}-annotations")
    user = f"system:serviceaccount:{NAMESPACE}:{EXTENDER}"
    # Its own account only: no kube-scheduler of the chart runs in this mode.
    assert policy["spec"]["matchConditions"][0]["expression"] == f'request.userInfo.username in ["{user}"]'
    # The policy confines that account to the decision annotation.
    cel = CelPolicy(policy)
    pod = {"metadata": {"name": "p", "annotations": {}}, "spec": {"containers": []}}
    forged = {
        "metadata": {"name": "p", "annotations": {"placement.gpustack.ai/claim": "{}"}},
        "spec": {"containers": []},
    }
    assert not cel.admit({"userInfo": {"username": user}}, forged, pod)[0]
    # One replica, replaced whole: the book is in memory.
    assert d["spec"]["replicas"] == 1 and d["spec"]["strategy"] == {"type": "Recreate"}


def test_the_extender_serves_tls_with_client_certificates_on_the_service(docs: list[Doc]) -> None:
    c = container(one(docs, "Deployment", EXTENDER), "extender")
    ns = parse(c["args"])
    assert (ns.address, ns.port) == ("0.0.0.0", 8888)
    assert (str(ns.tls_cert), str(ns.tls_key), str(ns.tls_client_ca)) == (
        "/etc/nodefabric/tls/tls.crt",
        "/etc/nodefabric/tls/tls.key",
        "/etc/nodefabric/tls/ca.crt",
    )
    svc = one(docs, "Service", EXTENDER)
    assert svc["spec"]["ports"] == [
        {"name": "extender", "port": 8888, "targetPort": "extender", "protocol": "TCP"}
    ]
    assert svc["spec"]["selector"]["app.kubernetes.io/component"] == "extender"
    metrics = one(docs, "Service", f"{EXTENDER}-metrics")
    assert metrics["spec"]["selector"]["app.kubernetes.io/component"] == "extender"


def openssl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["openssl", *args], capture_output=True, text=True, check=False, timeout=30)


def test_the_chart_makes_the_serving_and_the_client_certificate(docs: list[Doc], tmp_path: Path) -> None:
    secret = one(docs, "Secret", f"{EXTENDER}-tls")
    for k, v in secret["data"].items():
        (tmp_path / k).write_bytes(base64.b64decode(v))
    for cert in ("tls.crt", "client.crt"):
        done = openssl("verify", "-CAfile", str(tmp_path / "ca.crt"), str(tmp_path / cert))
        assert done.returncode == 0, done.stderr
    text = openssl("x509", "-noout", "-text", "-in", str(tmp_path / "tls.crt")).stdout
    assert f"DNS:{EXTENDER}.{NAMESPACE}.svc" in text
    client = openssl("x509", "-noout", "-subject", "-in", str(tmp_path / "client.crt")).stdout
    assert "kube-scheduler" in client


def test_sidecar_is_the_default_mode_and_bad_modes_are_refused(render) -> None:  # type: ignore[no-untyped-def]
    from chart_support import refusal

    docs = render({"extender": {"enabled": True}})
    assert one(docs, "Deployment", "nf-nodefabric-scheduler")
    assert not [d for d in of_kind(docs, "Deployment") if d["metadata"]["name"] == EXTENDER]
    assert "/extender/mode" in refusal(render, {"extender": {"enabled": True, "mode": "both"}})


def readme_scheduler_config() -> dict[str, Any]:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
    (block,) = [b for b in blocks if "kind: KubeSchedulerConfiguration" in b and "extenders:" in b]
    cfg: dict[str, Any] = yaml.safe_load(block)
    return cfg


def test_the_readme_snippet_names_what_service_mode_renders(render) -> None:  # type: ignore[no-untyped-def]
    """Released as "nodefabric" in namespace "nodefabric", as the README installs it."""
    cfg = readme_scheduler_config()
    (ext,) = cfg["extenders"]
    docs = render(SERVICE_MODE, release="nodefabric", namespace="nodefabric")
    svc = one(docs, "Service", "nodefabric-extender")
    port = svc["spec"]["ports"][0]["port"]
    assert ext["urlPrefix"] == f"https://nodefabric-extender.nodefabric.svc:{port}"
    assert ext["enableHTTPS"] is True and ext["nodeCacheCapable"] is True
    # Only the pods it manages go through it, and an outage blocks no other pod.
    assert ext["ignorable"] is True
    assert ext["managedResources"]
    secret = one(docs, "Secret", "nodefabric-extender-tls")
    files = {Path(ext["tlsConfig"][k]).name for k in ("caFile", "certFile", "keyFile")}
    assert files <= set(secret["data"])
