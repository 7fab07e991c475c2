from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


@pytest.fixture
def topo_text():
    def read(name: str) -> str:
        return (DATA / name).read_text()

    return read
