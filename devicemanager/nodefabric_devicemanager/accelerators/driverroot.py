"""Loading NVML from an NVIDIA driver root, as NVIDIA's own tools do with their driver-root setting.

The GPU Operator's driver container installs the driver under `/run/nvidia/driver` on the host; a
driver installed on the host itself has the root `/`. pynvml asks the dynamic loader for
`libnvidia-ml.so.1` by name, which our image does not have. Loading the library first, by its full path
under the driver root, makes the loader hand pynvml that same library: glibc matches an already loaded
object by its soname. The directories searched under the root are nvidia-container-toolkit's
(`internal/lookup/library.go`); symlinks are followed as if the root were `/`, so a driver root's own
absolute links (`/usr/lib64/libnvidia-ml.so.1 -> /usr/lib64/libnvidia-ml.so.570.86.15`) stay inside it.

The root is `--driver-root`, else `$NVIDIA_DRIVER_ROOT`, else none (the loader's own search). A failed
load is retried on the next pass (the driver container may still be installing); a successful one is
kept for the life of the process, as pynvml keeps its handle.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from typing import Any

from nodefabric_devicemanager.accelerators.library import LibraryUnavailable

log = logging.getLogger(__name__)

LIBRARY = "libnvidia-ml.so.1"
ENV = "NVIDIA_DRIVER_ROOT"
SEARCH_DIRS = (
    "/",
    "/usr/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/usr/lib/aarch64-linux-gnu/nvidia/current",
    "/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/lib/x86_64-linux-gnu/nvidia/current",
    "/lib/aarch64-linux-gnu/nvidia/current",
    "/glibc/lib",
)
REMEDY = (
    "set agent.runtimeClassName=nvidia in the chart (the NVIDIA container runtime mounts the library), "
    "or agent.driverRoot (passed to the agent as NVIDIA_DRIVER_ROOT; --driver-root on the command line): "
    "/run/nvidia/driver with the GPU Operator's driver container, / for a driver installed on the host"
)
_MAX_LINKS = 40  # the kernel's own limit on symlinks followed in one lookup

Loader = Callable[[str], Any]
# driver root -> the library path loaded from it, once a load succeeded
_loaded: dict[str, str] = {}


def configured(explicit: str | None) -> str | None:
    """The driver root in effect: the flag, else the environment, else none."""
    return explicit or os.environ.get(ENV) or None


def resolve_in(root: str, path: str) -> str | None:
    """`path`, seen from inside `root`, resolved as if `root` were `/`: absolute links restart at the root
    and `..` never climbs above it. None when it does not exist or loops."""
    pending = [p for p in path.split("/") if p]
    done: list[str] = []
    hops = 0
    while pending:
        part = pending.pop(0)
        if part == ".":
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        here = os.path.join(root, *done, part)
        try:
            target = os.readlink(here)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno != errno.EINVAL:  # EINVAL: not a symlink, an ordinary component
                return None
            done.append(part)
            continue
        hops += 1
        if hops > _MAX_LINKS:
            return None
        if target.startswith("/"):
            done = []
        pending = [p for p in target.split("/") if p] + pending
    final = os.path.join(root, *done)
    return final if os.path.isfile(final) else None


def candidates(root: str) -> list[str]:
    """Every existing `libnvidia-ml.so.1` under the root's library directories, resolved, in search order."""
    out: list[str] = []
    for directory in SEARCH_DIRS:
        found = resolve_in(root, os.path.join(directory, LIBRARY))
        if found is not None and found not in out:
            out.append(found)
    return out


def preload(root: str, *, loader: Loader | None = None) -> str:
    """Load NVML from the driver root, so pynvml's own load finds it; the path loaded. `loader`: how a
    path is loaded (default: ctypes.CDLL).

    Raises LibraryUnavailable naming the root, what was found and why it did not load, and the remedy.
    """
    if loader is None:
        import ctypes  # here, not at the top: only a GPU node with a driver root loads anything

        loader = ctypes.CDLL
    if root in _loaded:
        return _loaded[root]
    found = candidates(root)
    problems: list[str] = []
    for path in found:
        try:
            loader(path)
        except OSError as exc:
            # A library of the other architecture, or a truncated file: try the next directory.
            problems.append(f"{path}: {exc}")
            continue
        _loaded[root] = path
        log.info("loaded nvml from the driver root", extra={"driver_root": root, "library": path})
        return path
    where = f"{len(SEARCH_DIRS)} library directories under the driver root {root}"
    detail = "; ".join(problems) if problems else "not found"
    raise LibraryUnavailable(f"cannot load {LIBRARY} from {where} ({detail}): {REMEDY}")
