"""What `nodefabric inventory` loads as a process (issue 24): the start-up of a command that runs on every
uevent is paid in imports. Each test runs the real process and reads the names of every module it had
imported when it exited."""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from nodefabric_devicemanager.testing.scenarios import SCENARIOS
from nodefabric_operator import console

# What only other subcommands need: a node's inventory must never pay for them.
HEAVY = ("kubernetes", "aiohttp", "grpc", "prometheus_client", "yaml", "kopf", "google.protobuf", "pyudev")


# `python -m nodefabric_operator.console ARGS`, writing the names of every module it imported when it exits
# (-X importtime would miss those imported through importlib.import_module, as pynvml is).
RUN = (
    "import atexit, runpy, sys\n"
    "out = sys.argv.pop(1)\n"
    "atexit.register(lambda: open(out, 'w').write('\\n'.join(sorted(sys.modules))))\n"
    "runpy.run_module('nodefabric_operator.console', run_name='__main__', alter_sys=True)\n"
)


def imported(
    args: list[str], env: dict[str, str | None] | None = None
) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """The process's result and every module it imported. `env`: variables to set, or (None) to unset;
    PYDANTIC_DISABLE_PLUGINS is unset unless given."""
    changes: dict[str, str | None] = {"PYDANTIC_DISABLE_PLUGINS": None, **(env or {})}
    environ = {k: v for k, v in os.environ.items() if k not in changes}
    environ.update({k: v for k, v in changes.items() if v is not None})
    with tempfile.TemporaryDirectory() as tmp:
        modules = Path(tmp) / "modules"
        proc = subprocess.run(
            [sys.executable, "-c", RUN, str(modules), *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env=environ,
        )
        return proc, set(modules.read_text().split())


def loaded(names: set[str], package: str) -> bool:
    return any(n == package or n.startswith(package + ".") for n in names)


@pytest.fixture
def host_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    SCENARIOS["gpu8"](root)
    return root


@pytest.mark.parametrize("fmt", ["json", "table"])
def test_inventory_loads_none_of_the_other_commands_packages(host_root: Path, fmt: str) -> None:
    proc, names = imported(["inventory", "--root", str(host_root), "-o", fmt])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "nodefabric_devicemanager.inventory" in names  # the report is read right
    assert [p for p in HEAVY if loaded(names, p)] == []
    # argparse's own help formatter would import shutil (bz2, lzma) for help nobody asked for.
    assert [m for m in ("shutil", "bz2", "lzma") if m in names] == []
    # Only the chosen subcommand's module is imported.
    assert not loaded(names, "nodefabric_deviceplugin") and not loaded(names, "nodefabric_operator.cli")


def test_a_node_without_accelerators_loads_no_vendor_module(tmp_path: Path) -> None:
    """ctypes and each manufacturer's reader are imported where an accelerator of theirs is read."""
    root = tmp_path / "root"
    root.mkdir()
    SCENARIOS["sriov"](root)
    proc, names = imported(["inventory", "--root", str(root)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    vendor_modules = [
        "ctypes",
        "pynvml",
        *(f"nodefabric_devicemanager.accelerators.{m}" for m in ("amd", "ascend", "fabric")),
    ]
    assert [m for m in vendor_modules if m in names] == []


def test_a_gpu_node_without_nvml_learns_it_from_one_dlopen(host_root: Path) -> None:
    """No libnvidia-ml here: the fabric reader is loaded, pynvml is not, and the record says why."""
    proc, names = imported(["inventory", "--root", str(host_root), "-o", "table"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "nodefabric_devicemanager.accelerators.fabric" in names and "ctypes" in names
    assert "pynvml" not in names and "nodefabric_devicemanager.accelerators.ascend" not in names
    assert (
        "NvidiaFabricRead=False LibraryUnavailable: nvml: NVML Shared Library Not Found: set" in proc.stdout
    )


def test_inventory_does_not_look_for_pydantic_plugins(host_root: Path) -> None:
    """Looking reads every installed distribution's metadata (importlib.metadata, email, zipfile)."""
    proc, names = imported(["inventory", "--root", str(host_root)])
    assert proc.returncode == 0
    assert not loaded(names, "importlib.metadata") and not loaded(names, "email")


@pytest.mark.parametrize("value", ["__all__", "1", "true"])
def test_plugins_disabled_by_the_user_are_skipped_the_same_way(host_root: Path, value: str) -> None:
    proc, names = imported(["inventory", "--root", str(host_root)], {"PYDANTIC_DISABLE_PLUGINS": value})
    assert proc.returncode == 0 and "importlib.metadata" not in names


@pytest.mark.parametrize("value", ["", "logfire", "a,b"])
def test_a_user_who_names_plugins_to_skip_gets_pydantic_s_own_loader(host_root: Path, value: str) -> None:
    """PYDANTIC_DISABLE_PLUGINS naming plugins (or empty: none) means the user wants the others loaded:
    pydantic's loader runs as it documents, and the record printed is the same."""
    plain, _ = imported(["inventory", "--root", str(host_root)])
    proc, names = imported(["inventory", "--root", str(host_root)], {"PYDANTIC_DISABLE_PLUGINS": value})
    assert proc.returncode == 0 and "pydantic.plugin._loader" in names and "importlib.metadata" in names
    assert proc.stdout == plain.stdout


def test_the_stand_in_loader_finds_no_plugins_and_defers_anything_else_to_pydantic() -> None:
    """In a fresh interpreter (this one has pydantic's loader already): the stand-in answers get_plugins
    as pydantic's does with plugins disabled; any other name loads pydantic's own module."""
    code = (
        "import sys\n"
        "from nodefabric_operator import console\n"
        "assert console.skip_pydantic_plugins({}) is True\n"
        "from pydantic.plugin._loader import get_plugins\n"
        "assert tuple(get_plugins()) == ()\n"
        "from nodefabric_devicemanager.models import Endpoint\n"
        "assert Endpoint(name='x').wire()['name'] == 'x'\n"
        "assert 'importlib.metadata' not in sys.modules\n"
        "from pydantic.plugin import _loader\n"
        "assert _loader.PYDANTIC_ENTRY_POINT_GROUP == 'pydantic'\n"  # a name only the real one has
        "assert sys.modules['pydantic.plugin._loader'].__file__.endswith('_loader.py')\n"
        "assert console.skip_pydantic_plugins({}) is False\n"  # the real one is in place: left alone
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr


def test_nothing_is_replaced_once_pydantic_s_loader_is_imported() -> None:
    import pydantic.plugin._loader as real  # as in this test process, which built models long ago

    assert console.skip_pydantic_plugins({}) is False
    assert sys.modules["pydantic.plugin._loader"] is real


@pytest.mark.parametrize("args", [["--help"], ["--help", "inventory"], ["-h", "pick"], ["--he", "inventory"]])
def test_help_lists_every_subcommand(args: list[str]) -> None:
    """A command run builds only its own subparser; help asked before one still lists them all."""
    proc, names = imported(args)
    assert proc.returncode == 0
    listed = proc.stdout.split("COMMAND", 2)[-1]
    assert [name for name in console.COMMANDS if f"    {name} " not in listed] == []
    if args == ["--help"]:  # no command named: none of their modules is imported
        assert "pydantic" not in names and [p for p in HEAVY if loaded(names, p)] == []


@pytest.mark.parametrize("columns", ["40", "120", "0", "-3", "wide", None])
def test_help_is_as_wide_as_argparse_would_make_it(
    monkeypatch: pytest.MonkeyPatch, columns: str | None
) -> None:
    """console.Formatter finds the width without shutil; the help it formats is argparse's own."""
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)

    def help_text(formatter: type[argparse.HelpFormatter]) -> str:
        parser = console.Parser(prog="nodefabric", description="x " * 80, formatter_class=formatter)
        parser.add_argument("--root", help="host root to read /sys from " * 5)
        return parser.format_help()

    assert help_text(console.Formatter) == help_text(argparse.HelpFormatter)
    assert console.Parser(prog="p").formatter_class is console.Formatter


def test_the_process_freezes_its_imports_and_collects_after(host_root: Path) -> None:
    """As its own process, a command freezes the heap its imports left (collected once) and runs with the
    collector on."""
    code = (
        "import gc, sys\n"
        "from nodefabric_operator import console\n"
        f"sys.argv = ['nodefabric', 'inventory', '--root', {str(host_root)!r}]\n"
        "code = console.main()\n"
        "print(code, gc.isenabled(), gc.get_freeze_count() > 10000, file=sys.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.stderr.splitlines()[-1] == "0 True True", proc.stderr[-2000:]


def test_a_caller_s_heap_is_left_alone(host_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    frozen = gc.get_freeze_count()
    assert console.main(["inventory", "--root", str(host_root)]) == 0
    assert gc.isenabled() and gc.get_freeze_count() == frozen
