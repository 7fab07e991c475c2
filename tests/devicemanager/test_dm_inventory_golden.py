"""`nodefabric inventory` prints, byte for byte, what it printed when these files were written.

The files under golden/ were produced by the command itself (never written by hand): each scenario tree
read and printed in every format. Start-up work (a faster JSON encoder, lazy imports, deferred model
builds) must not move a byte. To rewrite them after an intended change of output, run this module with
NODEFABRIC_WRITE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nodefabric_devicemanager.testing.scenarios import SCENARIOS, bench
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder
from nodefabric_operator.console import main

GOLDEN = Path(__file__).parent / "golden" / "inventory"
WRITE = os.environ.get("NODEFABRIC_WRITE_GOLDEN") == "1"
FORMATS = ("json", "yaml", "table")


def hostile_names(root: Path) -> SysfsBuilder:
    """Interface names the kernel accepts and a printer must escape: non-ASCII, DEL, an ESC, a quote, a
    backslash, and a byte that is not UTF-8 (read back as a lone surrogate)."""
    b = SysfsBuilder(root)
    b.nic("0000:17:00.0", "ens1f0", host_bridge="pci0000:16", numa=0)
    for name in ("caf\u00e9", "del\x7fx", "esc\x1b[31m", 'q"uote', "back\\slash", "bad\udcffbyte", "\u7f51"):
        b.virtual(name, mtu=1500)
    return b


TREES = {
    **SCENARIOS,
    "bench-2x4": lambda root: bench(root, pfs=2, vfs=4),
    "hostile-names": hostile_names,
}


def golden(name: str, fmt: str) -> Path:
    return GOLDEN / f"{name}.{fmt}"


def printed(root: Path, fmt: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["inventory", "--root", str(root), "-o", fmt])
    out = capsys.readouterr().out
    return code, normal(out, root)


def normal(out: str, root: Path) -> str:
    """Paths show only in messages about the tree (a link escaping it): the golden files name the tree
    <root> and the directory around it <tmp>."""
    return out.replace(str(root), "<root>").replace(str(root.parent), "<tmp>")


@pytest.mark.parametrize("name", sorted(TREES))
def test_inventory_prints_what_it_printed(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    TREES[name](root)
    for fmt in FORMATS:
        code, out = printed(root, fmt, capsys)
        path = golden(name, fmt)
        text = f"exit {code}\n{out}"
        if WRITE:
            GOLDEN.mkdir(parents=True, exist_ok=True)
            path.write_bytes(text.encode("utf-8", "surrogateescape"))
        assert text.encode("utf-8", "surrogateescape") == path.read_bytes(), f"{name} -o {fmt}"


def test_the_process_prints_the_same_bytes(tmp_path: Path) -> None:
    """The real process (its own stdout encoding and buffering), for the tree with the hostile names."""
    root = tmp_path / "root"
    root.mkdir()
    hostile_names(root)
    for fmt in ("json", "yaml"):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "nodefabric_operator.console",
                "inventory",
                "--root",
                str(root),
                "-o",
                fmt,
            ],
            capture_output=True,
            timeout=120,
            check=False,
        )
        out = os.fsencode(normal(os.fsdecode(proc.stdout), root))
        assert f"exit {proc.returncode}\n".encode() + out == golden("hostile-names", fmt).read_bytes()
