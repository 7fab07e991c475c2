"""The agent's C heap (glibc's malloc): what a walk freed handed back to the kernel (`malloc_trim`), and
one arena for all of the agent's threads (`M_ARENA_MAX`).

A walk of a big node and the object written from it allocate megabytes that are garbage a moment later;
glibc keeps freed memory inside the process unless asked, so without this the agent's resident memory is
its peak for good. Elsewhere (musl, macOS) both do nothing: there is no such call to make.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable


@functools.cache
def _trim() -> Callable[[int], int] | None:
    try:
        # The process's own symbols, the C library's among them (no search for a file by name).
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # a C library without malloc_trim
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]


def release() -> bool:
    """Return free heap pages to the kernel; True when the C library could give any back."""
    trim = _trim()
    return bool(trim(0)) if trim is not None else False


_M_ARENA_MAX = -8  # mallopt's parameter number, from glibc's <malloc.h>


def one_arena() -> bool:
    """Have every thread started from now on allocate from the one main heap (glibc); True when set.

    glibc gives each thread that allocates its own arena, and memory freed in one is reused by no other:
    the walk's thread, the API thread and gRPC's threads each keep their own high-water mark. The
    agent's threads mostly take turns (under the GIL, or waiting on kubelet), so one heap costs them no
    measurable wait; it saves about 1 MiB on an 8 PF x 128 VF node (`hack/bench_agent.py`).
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # a C library without mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, 1))
