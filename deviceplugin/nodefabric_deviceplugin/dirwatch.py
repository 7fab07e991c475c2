"""Watching kubelet's device-plugin directory with inotify, through libc (ctypes), on the event loop.

kubelet restarts by deleting every socket in its directory and creating kubelet.sock anew; a plugin that
notices within milliseconds is registered again before kubelet's first pod admission needs it. inotify
says so the moment it happens and costs nothing while nothing happens, where a poll costs CPU every tick
and still answers late. The callers keep a slow poll as a fallback (no inotify, watches exhausted, the
directory itself replaced) and as a safety net.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import logging
import os
import struct
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

IN_ATTRIB = 0x00000004
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

_WATCHED = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF
# Events about the directory itself, or lost events: anything may have changed.
_ANYTHING = IN_Q_OVERFLOW | IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then `len` bytes of NUL-padded name


@functools.cache  # find_library runs ldconfig: once per process, not at every restarted watch
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None
    if not all(hasattr(libc, f) for f in ("inotify_init1", "inotify_add_watch")):
        return None
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    return libc


def parse(buffer: bytes) -> list[tuple[int, str]]:
    """(mask, name) of each event in one read of an inotify descriptor."""
    out: list[tuple[int, str]] = []
    offset = 0
    while offset + _EVENT.size <= len(buffer):
        _, mask, _, length = _EVENT.unpack_from(buffer, offset)
        offset += _EVENT.size
        raw = buffer[offset : offset + length].split(b"\0", 1)[0]
        offset += length
        out.append((mask, os.fsdecode(raw)))
    return out


class DirWatch:
    """Calls `on_change` (on the loop) when one of `names` in `path` is created, deleted, moved or
    replaced, or when the watch may have missed something. `lost` says the watch must be started again
    (the directory was deleted or moved away)."""

    def __init__(self, path: str, names: Iterable[str], on_change: Callable[[], None]) -> None:
        self.path = path
        self.names = frozenset(names)
        self.on_change = on_change
        self.lost = False
        self._fd = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._failing = False  # said once per spell of failures, not at every retry

    @property
    def active(self) -> bool:
        return self._fd >= 0 and not self.lost

    def start(self) -> bool:
        """Start watching; False (with a log line saying why) when inotify cannot be used here."""
        self.stop()
        libc = _libc()
        if libc is None:
            log.warning("inotify is unavailable; polling the plugin directory", extra={"path": self.path})
            return False
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            self._unavailable("inotify_init1", ctypes.get_errno())
            return False
        if libc.inotify_add_watch(fd, os.fsencode(self.path), _WATCHED) < 0:
            err = ctypes.get_errno()
            os.close(fd)
            self._unavailable("inotify_add_watch", err)
            return False
        self._fd, self.lost = fd, False
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(fd, self._readable)
        if self._failing:
            log.info("watching the plugin directory again", extra={"path": self.path})
        self._failing = False
        return True

    def _unavailable(self, call: str, err: int) -> None:
        if not self._failing:
            log.warning(
                "cannot watch the plugin directory; polling it instead",
                extra={"path": self.path, "call": call, "why": os.strerror(err)},
            )
        self._failing = True

    def _readable(self) -> None:
        try:
            buffer = os.read(self._fd, 64 * 1024)
        except BlockingIOError:
            return
        except OSError as exc:
            log.warning("reading inotify events failed", extra={"path": self.path, "why": str(exc)})
            self.lost = True
            self.on_change()
            return
        events = parse(buffer)
        if any(mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF) for mask, _ in events):
            self.lost = True
        if any(mask & _ANYTHING or name in self.names for mask, name in events):
            self.on_change()

    def stop(self) -> None:
        if self._fd >= 0:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._fd)
            os.close(self._fd)
        self._fd, self._loop = -1, None
