"""The import contracts hold the layers as issue 23 drew them, and cannot be walked around: an import
from a lower package to a higher one fails `lint-imports`, and so does one that reaches the higher
package through the one named exception (the node composition root, agent.wiring). Run on a copy of the
packages with one import planted, against the project's own contracts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "nodefabric_devicemanager": ROOT / "devicemanager",
    "nodefabric_deviceplugin": ROOT / "deviceplugin",
    "nodefabric_operator": ROOT / "operator",
}
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(tmp_path: Path, plant: tuple[str, str] | None) -> subprocess.CompletedProcess[str]:
    """lint-imports over a copy of the three packages, with `import <module>` added to the file `plant[0]`
    (a path under the packages' parent folders) when given."""
    for name, parent in PACKAGES.items():
        shutil.copytree(parent / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    if plant is not None:
        path, module = plant
        target = tmp_path / path
        text = target.read_text()
        head = "from __future__ import annotations\n"
        assert head in text, path
        target.write_text(text.replace(head, f"{head}\nimport {module}  # noqa: F401\n", 1))
    # The copies, ahead of the editable install; wide columns keep each contract on one line.
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "COLUMNS": "400"}
    return subprocess.run(
        [str(LINT), "--no-cache", "--config", str(tmp_path / "pyproject.toml")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed in this environment")
def test_the_tree_as_it_is_keeps_every_contract(tmp_path: Path) -> None:
    done = _lint(tmp_path, None)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed in this environment")
@pytest.mark.parametrize(
    ("plant", "contract"),
    [
        # The device manager importing the device plugin directly: the layers contract.
        (
            ("nodefabric_devicemanager/agent/kube.py", "nodefabric_deviceplugin.resources"),
            "Layers: operator above device plugin above device manager",
        ),
        # The device plugin importing the operator.
        (
            ("nodefabric_deviceplugin/resources.py", "nodefabric_operator.labels"),
            "Layers: operator above device plugin above device manager",
        ),
        # Through the exception: any device-manager module importing the composition root would reach
        # the device plugin by the one ignored import, which the layers contract cannot see.
        (
            ("nodefabric_devicemanager/agent/kube.py", "nodefabric_devicemanager.agent.wiring"),
            "Only the agent command and the demo import the node composition root",
        ),
    ],
)
def test_a_planted_import_upward_fails_the_contracts(
    tmp_path: Path, plant: tuple[str, str], contract: str
) -> None:
    done = _lint(tmp_path, plant)
    assert done.returncode != 0, done.stdout
    broken = [line for line in done.stdout.splitlines() if " BROKEN" in line]
    assert any(line.startswith(contract) for line in broken), done.stdout
