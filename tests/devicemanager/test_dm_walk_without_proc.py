"""Without /proc/self/fd (a container that does not mount /proc), the walk takes the path-based steps
where it would resolve a link through a descriptor (`child_link`, `child_link_read`, `_realpath`): every
tree of the VF goldens prints the same document byte for byte, damage and refusals included."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_dm_walk_vf_golden import GOLDEN, TREES
from walk_documents import assert_matches_golden

from nodefabric_devicemanager import hostroot


@pytest.mark.parametrize("name", sorted(TREES))
def test_a_walk_without_proc_prints_what_a_walk_with_it_prints(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hostroot, "_HAVE_FD_LINKS", False)
    assert_matches_golden(TREES, GOLDEN, name, tmp_path)
