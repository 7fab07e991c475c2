"""`helm lint` and `helm template` with the chart's own values alone: both pass, and with the optional second
scheduler on but no kube-scheduler tag, the one intended message and never a YAML parse error."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml
from chart_support import CHART, run_helm

TAG_REQUIRED = "scheduler.image.tag is empty: set it to your cluster's Kubernetes version"


def lint(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm), "lint", str(CHART), *args], capture_output=True, text=True, check=False, timeout=120
    )


def test_lint_passes_with_no_values(helm: Path) -> None:
    done = lint(helm)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "[ERROR]" not in out and "unable to parse YAML" not in out, out
    assert "1 chart(s) linted, 0 chart(s) failed" in out


def test_lint_with_the_scheduler_on_and_no_tag_says_only_the_intended_message(helm: Path) -> None:
    """helm lint turns `fail` into an INFO line and renders on: the template must still be valid YAML."""
    done = lint(helm, "--set", "extender.enabled=true")
    out = done.stdout + done.stderr
    assert "unable to parse YAML" not in out, out
    assert TAG_REQUIRED in out, out
    # With the tag given, lint has nothing to say about the templates at all.
    done = lint(helm, "--set", "extender.enabled=true", "--set", "scheduler.image.tag=v1.33.4")
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "[ERROR]" not in out and "Fail:" not in out, out


def test_template_renders_with_no_values_and_no_kubernetes_version(helm: Path, tmp_path: Path) -> None:
    done = run_helm(
        helm, "template", "nf", str(CHART), "-n", "nodefabric", values=None, tmp=tmp_path, kube_version=None
    )
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("Deployment", "nf-nodefabric-operator") in names
    assert not any("scheduler" in n for _, n in names)


def test_template_with_the_scheduler_on_and_no_tag_is_refused_naming_the_value(
    helm: Path, tmp_path: Path
) -> None:
    done = run_helm(
        helm,
        "template",
        "nf",
        str(CHART),
        "-n",
        "nodefabric",
        values={"extender": {"enabled": True}},
        tmp=tmp_path,
        kube_version=None,
    )
    assert done.returncode != 0 and TAG_REQUIRED in done.stderr, done.stderr
