from __future__ import annotations

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
