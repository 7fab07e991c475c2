from __future__ import annotations

import importlib
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


@pytest.fixture
def topo_text():
    def read(name: str) -> str:
        return (DATA / name).read_text()

    return read


@pytest.fixture(autouse=True)
def fresh_fabric_reports():
    """A fabric problem is logged at Warning once per process; each test starts as a fresh process would."""
    # The package exports the function `detect` under the module's name: ask for the module itself.
    reported = importlib.import_module("nodefabric_devicemanager.accelerators.detect")._reported
    reported.clear()
    yield
    reported.clear()
