"""What the golden walk tests compare: the document `nodefabric inventory` prints for a built tree."""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Mapping
from pathlib import Path


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
