"""Fixtures for the Helm chart tests: a real helm binary (from PyPI, via hack/fetch_helm.py) and renders."""

from __future__ import annotations

import copy
import fcntl
import hashlib
import json
import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from chart_support import (
    CHART,
    KUBE_VERSION,
    NAMESPACE,
    RELEASE,
    ROOT,
    Doc,
    RenderError,
    parse_docs,
    run_helm,
)

Render = Callable[..., list[Doc]]


@pytest.fixture(scope="session")
def helm() -> Path:
    done = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "fetch_helm.py")], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        pytest.fail(f"hack/fetch_helm.py could not provide helm:\n{done.stdout}\n{done.stderr}")
    path = Path(done.stdout.strip().splitlines()[-1])
    assert path.is_file(), path
    return path


@pytest.fixture(scope="module")
def render(request: pytest.FixtureRequest, helm_render: Render, render_extender: Render) -> Render:
    """`helm template` with the given values; in a module marked `with_extender` (one that covers the
    optional second scheduler and its extender among the other components) with the extender on."""
    return render_extender if request.node.get_closest_marker("with_extender") else helm_render


@pytest.fixture(scope="session")
def helm_render(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> Render:
    """`helm template` of the chart with the given values; the manifests, CRDs included. Renders are
    memoised for the session (each caller gets its own copy), so repeated variants cost one helm run."""
    seen: dict[str, list[Doc] | RenderError] = {}

    def _render(
        values: dict[str, Any] | None = None,
        *,
        kube_version: str = KUBE_VERSION,
        release: str = RELEASE,
        namespace: str = NAMESPACE,
        scheduler_tag: bool = True,
    ) -> list[Doc]:
        """scheduler_tag=False renders without the kube-scheduler tag an install sets for its cluster."""
        key = json.dumps([values, kube_version, release, namespace, scheduler_tag], sort_keys=True)
        if key not in seen:
            try:
                seen[key] = _shared(
                    key,
                    lambda: _helm_template(
                        values,
                        kube_version=kube_version,
                        release=release,
                        namespace=namespace,
                        scheduler_tag=scheduler_tag,
                    ),
                )
            except RenderError as err:
                seen[key] = err
        got = seen[key]
        if isinstance(got, RenderError):
            raise RenderError(str(got))
        return copy.deepcopy(got)

    # Parallel workers (pytest-xdist) share renders through the session's common temporary directory: each
    # distinct render is one helm run for the whole session, whichever worker asks first; the others wait
    # on its lock and read its result. A render whose check failed (ApiRefusal) is not stored.
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    shared = tmp_path_factory.getbasetemp().parent / "helm-renders" if worker else None
    if shared is not None:
        shared.mkdir(exist_ok=True)

    def _shared(key: str, produce: Callable[[], list[Doc]]) -> list[Doc]:
        if shared is None:
            return produce()
        entry = shared / hashlib.sha256(key.encode()).hexdigest()
        with entry.with_suffix(".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if entry.exists():
                stored = pickle.loads(entry.read_bytes())
                if isinstance(stored, RenderError):
                    raise stored
                return stored  # type: ignore[no-any-return]
            try:
                docs = produce()
            except RenderError as err:
                _store(entry, err)
                raise
            _store(entry, docs)
            return docs

    def _helm_template(
        values: dict[str, Any] | None,
        *,
        kube_version: str,
        release: str,
        namespace: str,
        scheduler_tag: bool,
    ) -> list[Doc]:
        tmp = tmp_path_factory.mktemp("render")
        args = ["template", release, str(CHART), "--namespace", namespace, "--kube-version", kube_version]
        done = run_helm(
            helm,
            *args,
            "--include-crds",
            values=values,
            tmp=tmp,
            kube_version=kube_version if scheduler_tag else None,
        )
        if done.returncode != 0:
            raise RenderError(done.stderr)
        return parse_docs(done.stdout)

    return _render


def _store(entry: Path, value: object) -> None:
    partial = entry.with_suffix(".partial")
    partial.write_bytes(pickle.dumps(value))
    os.replace(partial, entry)


@pytest.fixture(scope="module")
def default_docs(render: Render) -> list[Doc]:
    return render()  # memoised by helm_render: one helm run per distinct render in the session


def with_extender(values: dict[str, Any] | None) -> dict[str, Any]:
    """The values with the optional second scheduler and its extender on, unless they say otherwise."""
    merged = copy.deepcopy(values) if values else {}
    extender = merged.setdefault("extender", {})
    if isinstance(extender, dict):
        extender.setdefault("enabled", True)
    return merged


@pytest.fixture(scope="session")
def render_extender(helm_render: Render) -> Render:
    """`render`, with extender.enabled=true unless the values set it (the extender is off by default)."""

    def _render(values: dict[str, Any] | None = None, **kwargs: Any) -> list[Doc]:
        return helm_render(with_extender(values), **kwargs)

    return _render


@pytest.fixture(scope="session")
def extender_docs(render_extender: Render) -> list[Doc]:
    return render_extender()
