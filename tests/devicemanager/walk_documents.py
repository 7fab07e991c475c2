"""What the golden walk tests compare: the document `nodefabric inventory` prints for a built tree."""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest


def document(root: Path) -> str:
    """`nodefabric inventory --root ROOT -o json` as it prints it, its exit code on the first line; the
    temporary directory the tree was built in (refusals name where an escaping link lands) as <TREE>."""
    from nodefabric_operator.console import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["inventory", "--root", str(root), "-o", "json"])
    text = out.getvalue().replace(os.path.realpath(root.parent), "<TREE>")
    return f"exit {code}\n{text}"


def built(trees: Mapping[str, Callable[[Path], object]], name: str, base: Path) -> Path:
    """The root of tree `name`, built under `base`."""
    root = base / name / "root"
    root.mkdir(parents=True)
    trees[name](root)
    return root


def can_mknod(tmp: Path) -> bool:
    try:
        os.mknod(tmp / "probe", 0o020600, os.makedev(1, 3))
    except PermissionError:
        return False
    return True


def assert_matches_golden(
    trees: Mapping[str, Callable[[Path], object]], goldens: Path, name: str, tmp: Path
) -> None:
    """Tree `name`'s document is its golden, printed by the code the record must match."""
    if "chardev" in name and not can_mknod(tmp):
        pytest.skip("mknod needs CAP_MKNOD")
    golden = goldens / f"{name}.txt"
    assert golden.is_file(), f"no golden for {name}: regenerate with the code the record must match"
    assert document(built(trees, name, tmp)) == golden.read_text(encoding="utf-8")
