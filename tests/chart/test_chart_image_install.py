"""The README's "The image: published, or your own" installs, flag for flag, through `helm template`:
each renders the image it says (a private registry's tag, the release's digest) on every workload, and
every render passes the API server's naming rules (chart_support.run_helm)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml
from chart_support import CHART, KUBE_VERSION, ROOT, Doc, run_helm, workloads

DIGEST = "sha256:" + "ab" * 32


def readme_installs() -> list[list[str]]:
    """The flags (after the chart) of each `helm install` in the README's image section."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### The image: published, or your own") : text.index("### Test on kind")]
    out = []
    for block in re.findall(r"```sh\n(.*?)```", section, flags=re.S):
        joined = re.sub(r"\\\n", " ", block)
        for raw in joined.splitlines():
            line = raw.split(" #", 1)[0]
            if line.startswith("helm install"):
                words = shlex.split(line.replace("<digest from the release notes>", DIGEST.split(":")[1]))
                out.append(words[words.index("charts/nodefabric") + 1 :])
    return out


INSTALLS = readme_installs()


def test_the_readme_has_both_installs() -> None:
    assert len(INSTALLS) == 2


def images(docs: list[Doc]) -> set[str]:
    return {
        c["image"]
        for w in workloads(docs)
        for c in w["spec"]["template"]["spec"]["containers"]
        if "kube-scheduler" not in c["image"]
    }


@pytest.mark.parametrize(
    ("flags", "image"),
    [
        (INSTALLS[0], f"ghcr.io/gpustack/nodefabric@{DIGEST}"),
        (INSTALLS[1], "registry.example.com/team/nodefabric:0.1.0-dev"),
    ],
    ids=["release-digest", "private-registry"],
)
def test_each_readme_install_renders_its_image(
    helm: Path, tmp_path: Path, flags: list[str], image: str
) -> None:
    flags = [f for f in flags if f not in ("--wait",)]
    args = ["template", "nodefabric", str(CHART), "--kube-version", KUBE_VERSION, *flags]
    done = run_helm(helm, *args, values=None, tmp=tmp_path, kube_version=None)
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert images(docs) == {image}


def test_a_numeric_tag_needs_set_string(helm: Path, tmp_path: Path) -> None:
    """What the README warns about: `--set image.tag=2` is a number, which the schema refuses."""
    base = ["template", "nf", str(CHART), "--kube-version", KUBE_VERSION]
    done = run_helm(helm, *base, "--set", "image.tag=2", values=None, tmp=tmp_path)
    assert done.returncode != 0 and "image/tag" in done.stderr
    done = run_helm(helm, *base, "--set-string", "image.tag=2", values=None, tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    assert images([d for d in yaml.safe_load_all(done.stdout) if d]) == {"ghcr.io/gpustack/nodefabric:2"}


def test_a_pull_secret_as_the_readme_sets_it(helm: Path, tmp_path: Path) -> None:
    base = ["template", "nf", str(CHART), "--kube-version", KUBE_VERSION]
    done = run_helm(helm, *base, "--set", "imagePullSecrets[0].name=regcred", values=None, tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    for w in workloads([d for d in yaml.safe_load_all(done.stdout) if d]):
        assert w["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}], w["metadata"][
            "name"
        ]
