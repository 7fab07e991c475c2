"""NVML from an NVIDIA driver root (issue 14): `--driver-root` / $NVIDIA_DRIVER_ROOT load libnvidia-ml.so.1
from the root's library directories before pynvml asks for it; without it, the condition says how to fix
it. The library edge is the only thing faked: a real shared object built here, loaded by the real pynvml
in a child process (pynvml keeps its handle for the life of a process)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from nodefabric_devicemanager import inventory
from nodefabric_devicemanager.accelerators import driverroot, nvidia
from nodefabric_devicemanager.accelerators.detect import forget_reported
from nodefabric_devicemanager.accelerators.library import LibraryUnavailable
from nodefabric_devicemanager.accelerators.nvidia import Nvml
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.testing.accelerators import gpu_function
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder

# NVML's entry points that nvmlInit, nvmlDeviceGetCount and nvmlShutdown reach: a driver with no GPUs.
FAKE_NVML = r"""
int nvmlInitWithFlags(unsigned int flags) { (void)flags; return 0; }
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned int *count) { *count = 0; return 0; }
const char *nvmlErrorString(int result) { (void)result; return "fake"; }
"""


@pytest.fixture
def gpu_host(tmp_path):
    b = SysfsBuilder(tmp_path / "host")
    gpu_function(b, "0000:1b:00.0")
    return b.root


@pytest.fixture
def driver_root(tmp_path):
    """A driver root as the GPU Operator lays it out: the versioned library in /usr/lib64, and the soname
    link pointing at it by an ABSOLUTE path that only makes sense inside the root."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build a stand-in libnvidia-ml")
    root = tmp_path / "driver"
    lib = root / "usr/lib64"
    lib.mkdir(parents=True)
    src = tmp_path / "nvml.c"
    src.write_text(FAKE_NVML)
    subprocess.run(
        [
            cc,
            "-shared",
            "-fPIC",
            "-Wl,-soname,libnvidia-ml.so.1",
            "-o",
            str(lib / "libnvidia-ml.so.570.86.15"),
            str(src),
        ],
        check=True,
        capture_output=True,
    )
    (lib / "libnvidia-ml.so.1").symlink_to("/usr/lib64/libnvidia-ml.so.570.86.15")
    return root


def inventory_command(host, *args, env=None):
    proc = subprocess.run(
        [sys.executable, "-m", "nodefabric_operator.console", "inventory", "--root", str(host), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, proc.stderr
    conditions = {c["type"]: c for c in json.loads(proc.stdout)["status"]["conditions"]}
    return conditions["NvidiaFabricRead"], proc.stderr


def test_nvml_is_loaded_from_the_driver_root(gpu_host, driver_root):
    cond, err = inventory_command(gpu_host, "--driver-root", str(driver_root))
    # The library loaded and answered: it knows no GPU at 0000:1b:00.0, a read, not a missing library.
    assert (cond["status"], cond["reason"]) == ("False", "ReadFailed")
    assert "0000:1b:00.0: no answer from nvml" in cond["message"]
    assert "loaded nvml from the driver root" in err and "libnvidia-ml.so.570.86.15" in err


def test_the_driver_root_comes_from_the_environment_too(gpu_host, driver_root):
    cond, _ = inventory_command(gpu_host, env={"NVIDIA_DRIVER_ROOT": str(driver_root)})
    assert cond["reason"] == "ReadFailed"


def test_without_nvml_the_condition_keeps_its_reason_and_carries_the_remedy(gpu_host):
    cond, _ = inventory_command(gpu_host, env={"NVIDIA_DRIVER_ROOT": ""})
    assert (cond["status"], cond["reason"]) == ("False", "LibraryUnavailable")
    assert "agent.runtimeClassName=nvidia" in cond["message"] and "NVIDIA_DRIVER_ROOT" in cond["message"]


def test_a_driver_root_without_the_library_says_where_it_looked(gpu_host, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    cond, _ = inventory_command(gpu_host, "--driver-root", str(empty))
    assert cond["reason"] == "LibraryUnavailable"
    assert f"under the driver root {empty} (not found)" in cond["message"]
    assert "agent.runtimeClassName=nvidia" in cond["message"]


def test_a_library_that_will_not_load_is_named_with_the_loaders_error(tmp_path):
    root = tmp_path / "driver"
    (root / "usr/lib64").mkdir(parents=True)
    (root / "usr/lib64/libnvidia-ml.so.1").write_bytes(b"not an ELF object")
    with pytest.raises(LibraryUnavailable) as err:
        driverroot.preload(str(root))
    assert f"{root}/usr/lib64/libnvidia-ml.so.1:" in str(err.value)


def test_links_resolve_inside_the_root_as_if_it_were_slash(tmp_path):
    root = tmp_path / "driver"
    (root / "usr/lib64").mkdir(parents=True)
    (root / "usr/lib64/libnvidia-ml.so.570").write_bytes(b"")
    (root / "lib64").symlink_to("usr/lib64")
    (root / "usr/lib64/libnvidia-ml.so.1").symlink_to("/usr/lib64/libnvidia-ml.so.570")
    (root / "usr/lib64/escape.so").symlink_to("../../../../../../etc/hostname")
    real = str(root / "usr/lib64/libnvidia-ml.so.570")
    assert driverroot.resolve_in(str(root), "/lib64/libnvidia-ml.so.1") == real
    assert driverroot.candidates(str(root)) == [real]  # found through /usr/lib64 and /lib64: once
    # `..` never climbs above the root: this names <root>/etc/hostname, which is not there.
    assert driverroot.resolve_in(str(root), "/usr/lib64/escape.so") is None
    (root / "loop").symlink_to("/loop")
    assert driverroot.resolve_in(str(root), "/loop") is None


def test_a_missing_library_is_one_warning_while_it_lasts_not_one_per_pass(tmp_path, caplog, monkeypatch):
    monkeypatch.delenv("NVIDIA_DRIVER_ROOT", raising=False)
    forget_reported()
    b = SysfsBuilder(tmp_path)
    gpu_function(b, "0000:1b:00.0")
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            reading = inventory.read(HostRoot.at(b.root), driver_root=str(tmp_path / "nowhere"))
    cond = next(c for c in reading.conditions if c.type == "NvidiaFabricRead")
    assert cond.reason == "LibraryUnavailable"
    warnings = [r for r in caplog.records if "could not read the accelerator fabric" in r.getMessage()]
    assert len(warnings) == 1
    assert "agent.runtimeClassName=nvidia" in warnings[0].__dict__["error"]


def test_the_driver_root_setting_is_the_flag_then_the_environment(monkeypatch):
    monkeypatch.setenv("NVIDIA_DRIVER_ROOT", "/run/nvidia/driver")
    assert driverroot.configured(None) == "/run/nvidia/driver"
    assert driverroot.configured("/") == "/"
    monkeypatch.setenv("NVIDIA_DRIVER_ROOT", "")
    assert driverroot.configured(None) is None


def test_the_gpu_operator_layout_is_searched(tmp_path):
    # Debian/Ubuntu multiarch and RHEL lib64, as nvidia-container-toolkit looks.
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib/aarch64-linux-gnu"):
        assert d in driverroot.SEARCH_DIRS
    assert Path(driverroot.SEARCH_DIRS[0]) == Path("/")


def test_a_library_the_loader_finds_is_handed_to_pynvml(monkeypatch) -> None:
    """The dlopen that spares a node without NVML the pynvml import lets any loadable library through:
    pynvml then makes its own load and answers (here: libc stands in, and pynvml still finds no NVML)."""
    monkeypatch.delenv(driverroot.ENV, raising=False)
    monkeypatch.delitem(sys.modules, "pynvml")  # as in a fresh process (restored afterwards)
    monkeypatch.setattr(driverroot, "LIBRARY", "libc.so.6")
    nvml = Nvml()
    with pytest.raises(LibraryUnavailable, match="nvml: NVML Shared Library Not Found: set"):
        nvml.read()
    assert nvml._nvml is not None  # pynvml was imported and asked


def test_no_library_is_said_without_importing_pynvml(monkeypatch) -> None:
    monkeypatch.delenv(driverroot.ENV, raising=False)
    monkeypatch.delitem(sys.modules, "pynvml")
    nvml = Nvml()
    with pytest.raises(LibraryUnavailable, match="nvml: NVML Shared Library Not Found: set"):
        nvml.read()
    assert nvml._nvml is None and "pynvml" not in sys.modules  # answered by the one dlopen


def test_once_pynvml_is_imported_its_own_load_decides(monkeypatch) -> None:
    """Nothing left to spare: pynvml is asked, as a test that makes its init hang relies on."""
    monkeypatch.delenv(driverroot.ENV, raising=False)
    asked = []
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: asked.append(1) or pynvml._nvmlCheckReturn(12))
    with pytest.raises(LibraryUnavailable, match="nvml: NVML Shared Library Not Found: set"):
        Nvml().read()
    assert asked == [1]


def test_the_message_for_no_library_is_pynvml_s_own() -> None:
    """Said by the dlopen or by pynvml, a node without NVML prints the same condition."""
    assert str(pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)) == nvidia._NOT_FOUND
