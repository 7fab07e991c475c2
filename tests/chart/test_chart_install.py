"""`helm install` itself (client dry run) against the embedded API, as an operator would run it against a
cluster: helm's discovery maps every kind the chart renders, its kubeVersion check passes on the API's own
version, and the NOTES tell what to look at for what this install serves."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_support import CHART, NAMESPACE, RELEASE, Doc

from nodefabric_operator.demo.kubeapi import running_api

KUBE = "1.34.0"


def plural(kind: str) -> str:
    lower = kind.lower()
    if lower.endswith("y"):
        return lower[:-1] + "ies"
    return lower + ("es" if lower.endswith("s") else "s")


def dry_install(
    helm: Path, tmp_path: Path, render: Any, values: dict[str, Any], *, scheduler_tag: bool = True
) -> str:
    """The NOTES of `helm install --dry-run=client` against the embedded API, serving every kind the chart
    renders, as a cluster does: helm maps each manifest to its resource before it prints anything."""
    docs: list[Doc] = render(values, kube_version=KUBE, scheduler_tag=scheduler_tag)
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))

    async def run() -> subprocess.CompletedProcess[str]:
        async with running_api(directory=str(tmp_path)) as k:
            for d in docs:
                key = f"{d['apiVersion']}/{plural(d['kind'])}"
                if key not in k.api.resources:
                    k.api.declare(key, kind=d["kind"], namespaced="namespace" in d["metadata"])
            cmd = [str(helm), "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client"]
            cmd += ["--kubeconfig", k.kubeconfig, "--disable-openapi-validation"]
            if scheduler_tag:
                cmd += ["--set", f"scheduler.image.tag=v{KUBE}"]
            cmd += ["-f", str(tmp_path / "values.yaml")]
            # helm keeps discovery caches under $HOME: this run's stay in its own directory.
            env = {**os.environ, "HOME": str(tmp_path)}
            return await asyncio.to_thread(
                subprocess.run, cmd, capture_output=True, text=True, timeout=60, env=env
            )

    done = asyncio.run(run())
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("\nNOTES:\n", 1)
    assert len(notes) == 2, "helm printed no NOTES"
    return notes[1]


def test_helm_installs_the_chart_on_the_embedded_api(helm: Path, tmp_path: Path, render: Any) -> None:
    """The embedded API says it is the Kubernetes whose APIs it serves (resource.k8s.io/v1: >= 1.34), which
    helm's kubeVersion check reads, and its discovery names the core group "v1" (kmock's "/v1" left
    helm's REST mapper without a single core kind)."""
    notes = dry_install(helm, tmp_path, render, {})
    assert f"nodefabric 0.1.0 is installed in namespace {NAMESPACE}" in notes


def test_helm_install_needs_no_value(helm: Path, tmp_path: Path, render: Any) -> None:
    """No --set at all: the second scheduler (whose image tag must name the cluster's version) is optional
    and off by default, so nothing is left for the operator to fill in."""
    notes = dry_install(helm, tmp_path, render, {}, scheduler_tag=False)
    assert f"nodefabric 0.1.0 is installed in namespace {NAMESPACE}" in notes
    # What it runs by default, and how a namespace opts in to group admission.
    assert "kubectl label namespace <ns> placement.gpustack.ai/admission=enabled" in notes
    assert "kubectl get placementgroups -A" in notes
    assert "spec.schedulerName" not in notes  # no second scheduler unless extender.enabled


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, {"allocatable": True, "slices": False}),
        # DRA serves every endpoint: there are no device-plugin resources to look for.
        ({"dra": {"enabled": True}}, {"allocatable": False, "slices": True}),
        ({"dra": {"enabled": True, "devicePlugin": True}}, {"allocatable": True, "slices": True}),
    ],
)
def test_the_notes_name_what_this_install_serves(
    helm: Path, tmp_path: Path, render: Any, values: dict[str, Any], expected: dict[str, bool]
) -> None:
    notes = dry_install(helm, tmp_path, render, values)
    assert ("status.allocatable" in notes) is expected["allocatable"]
    slices = "kubectl get resourceslices --field-selector spec.driver=rdma.gpustack.ai"
    assert (slices in notes) is expected["slices"]


def test_the_webhook_certificate_is_kept_across_upgrades(helm: Path, tmp_path: Path, render: Any) -> None:
    """`lookup` reads the Secret an earlier release wrote (helm --dry-run=server reads the cluster): the
    same CA and certificate are rendered again, so the webhook's caBundle never changes under the pods."""
    import base64

    docs: list[Doc] = render({}, kube_version=KUBE, scheduler_tag=False)
    secret_name = "nf-nodefabric-placement-webhook-tls"
    earlier = {
        "apiVersion": "v1",
        "kind": "Secret",
        # As the earlier release left it: helm's ownership marks, so this install takes it over.
        "metadata": {
            "name": secret_name,
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/managed-by": "Helm"},
            "annotations": {
                "meta.helm.sh/release-name": RELEASE,
                "meta.helm.sh/release-namespace": NAMESPACE,
            },
        },
        "type": "kubernetes.io/tls",
        "data": {
            k: base64.b64encode(f"earlier {k}".encode()).decode() for k in ("tls.crt", "tls.key", "ca.crt")
        },
    }

    async def run() -> subprocess.CompletedProcess[str]:
        async with running_api(directory=str(tmp_path)) as k:
            for d in docs:
                key = f"{d['apiVersion']}/{plural(d['kind'])}"
                if key not in k.api.resources:
                    k.api.declare(key, kind=d["kind"], namespaced="namespace" in d["metadata"])
            k.api.put_object("v1/secrets", earlier, validate=False)
            cmd = [str(helm), "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=server"]
            cmd += ["--kubeconfig", k.kubeconfig, "--disable-openapi-validation"]
            env = {**os.environ, "HOME": str(tmp_path)}
            return await asyncio.to_thread(
                subprocess.run, cmd, capture_output=True, text=True, timeout=60, env=env
            )

    done = asyncio.run(run())
    assert done.returncode == 0, done.stderr
    manifest = done.stdout.split("\nMANIFEST:\n", 1)[1].split("\nNOTES:\n", 1)[0]
    rendered = [d for d in yaml.safe_load_all(manifest) if d]
    (secret,) = [d for d in rendered if d["kind"] == "Secret" and d["metadata"]["name"] == secret_name]
    assert secret["data"] == earlier["data"]
    (hooks,) = [d for d in rendered if d["kind"] == "MutatingWebhookConfiguration"]
    assert {w["clientConfig"]["caBundle"] for w in hooks["webhooks"]} == {earlier["data"]["ca.crt"]}
