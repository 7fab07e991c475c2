from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

import pytest

from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.testing.scenarios import SCENARIOS
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder


@pytest.fixture
def host_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    return root


@pytest.fixture
def builder(host_root: Path) -> SysfsBuilder:
    return SysfsBuilder(host_root)


@pytest.fixture
def scenario(host_root: Path) -> Callable[[str], HostRoot]:
    def build(name: str) -> HostRoot:
        SCENARIOS[name](host_root)
        return HostRoot.at(host_root)

    return build


@pytest.fixture(autouse=True)
def fresh_fabric_reports():
    """A fabric problem is logged at Warning once per process; each test starts as a fresh process would."""
    # The package exports the function `detect` under the module's name: ask for the module itself.
    reported = importlib.import_module("nodefabric_devicemanager.accelerators.detect")._reported
    reported.clear()
    yield
    reported.clear()
