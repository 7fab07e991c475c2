"""Reading a host's /sys, /dev and /proc from an explicit root, safely.

Every read resolves the symlink chain and refuses a path that lands outside the root (sysfs is a chain
of symlinks, so checking the spelled path proves nothing), and one attribute is capped at 64 KiB: an
oversized file is an error, never a truncated value that would parse as something else.

Resolution is paid once per directory (`HostRoot.dir`), not once per attribute: attributes inside a
resolved directory are opened with O_NOFOLLOW, and only one that is itself a symlink is resolved.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from dataclasses import dataclass

log = logging.getLogger(__name__)

MAX_ATTRIBUTE_BYTES = 64 * 1024


class HostReadError(OSError):
    """A read of the host that could not be answered. Never to be read as "absent"."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class PathEscapesRoot(HostReadError):
    pass


class AttributeTooLarge(HostReadError):
    pass


_FD_LINKS = "/proc/self/fd"
_HAVE_FD_LINKS = os.path.isdir(_FD_LINKS)


def _realpath(path: str) -> str:
    """os.path.realpath, but let the kernel walk the chain when it can: one open(O_PATH) and one readlink
    instead of an lstat per component in Python, several times faster over sysfs' deep link chains."""
    if _HAVE_FD_LINKS:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            # Absent, dangling or looping: realpath gives the same answer it always did (and the same
            # refusal when the dangling target lies outside the root).
            return os.path.realpath(path)
        try:
            return os.readlink(f"{_FD_LINKS}/{fd}")
        except OSError:
            return os.path.realpath(path)
        finally:
            os.close(fd)
    return os.path.realpath(path)


@dataclass(frozen=True, slots=True)
class HostRoot:
    """The host as seen from `root` ("/" on a node; a fixture tree in tests; "/host" in a container)."""

    root: str

    @classmethod
    def at(cls, root: str | os.PathLike[str] = "/") -> HostRoot:
        return cls(os.path.realpath(os.fspath(root)))

    def host_path(self, path: str) -> str:
        """Join a host-absolute path ("/sys/class/net") onto the root, unresolved."""
        rel = path.lstrip("/")
        return os.path.join(self.root, rel) if rel else self.root

    def display(self, path: str) -> str:
        """A path as the host would name it, for messages."""
        if self.root == "/":
            return path
        rel = os.path.relpath(path, self.root)
        return "/" if rel == "." else "/" + rel

    def contains(self, resolved: str) -> bool:
        return self.root in ("/", resolved) or resolved.startswith(self.root + os.sep)

    def resolve(self, path: str) -> str:
        """Resolve a path already joined onto the root; refuse one that lands outside it."""
        resolved = _realpath(path)
        if not self.contains(resolved):
            log.warning(
                "refused a path that resolves outside the host root",
                extra={"path": self.display(path), "target": resolved, "root": self.root},
            )
            raise PathEscapesRoot(self.display(path), f"resolves to {resolved}, outside {self.root}")
        return resolved

    def dir(self, path: str) -> SysDir:
        """A resolved directory from a host-absolute path."""
        return SysDir(self, self.resolve(self.host_path(path)))

    def exists(self, path: str) -> bool:
        try:
            self.resolve(self.host_path(path))
        except PathEscapesRoot:
            return False
        return os.path.exists(self.host_path(path))


@dataclass(frozen=True, slots=True)
class SysDir:
    """A directory whose path is resolved and known to lie inside the host root."""

    host: HostRoot
    path: str

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    @property
    def shown(self) -> str:
        return self.host.display(self.path)

    def _child_path(self, name: str) -> str:
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"not a single path component: {name!r}")
        return os.path.join(self.path, name)

    def child(self, name: str) -> SysDir:
        """A subdirectory or a symlink to one (e.g. "device", "physfn"), resolved and checked."""
        path = self._child_path(name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise HostReadError(self.host.display(path), exc.strerror or str(exc)) from exc
        if stat.S_ISLNK(st.st_mode):
            path = self.host.resolve(path)
        return SysDir(self.host, path)

    def child_opt(self, name: str) -> SysDir | None:
        try:
            return self.child(name)
        except FileNotFoundError:
            return None

    def has(self, name: str) -> bool:
        return os.path.lexists(self._child_path(name))

    def is_dir(self) -> bool:
        return os.path.isdir(self.path)

    def list(self) -> list[str]:
        """Entry names, sorted: sysfs directory order is not stable and everything built on it is compared."""
        try:
            return sorted(os.listdir(self.path))
        except OSError as exc:
            raise HostReadError(self.shown, exc.strerror or str(exc)) from exc

    def link_name(self, name: str) -> str | None:
        """The last component of a symlink's target ("driver" -> "mlx5_core"), without following it."""
        try:
            return os.path.basename(os.readlink(self._child_path(name)))
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.EINVAL:  # not a symlink
                return None
            raise HostReadError(self.host.display(self._child_path(name)), exc.strerror or str(exc)) from exc

    def read(self, name: str) -> str:
        """One attribute, stripped of its trailing newline. Raises FileNotFoundError when absent."""
        path = self._child_path(name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise HostReadError(self.host.display(path), exc.strerror or str(exc)) from exc
            # The attribute itself is a symlink: resolve and check it, then open what it points at.
            try:
                fd = os.open(self.host.resolve(path), os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                raise
            except PathEscapesRoot:
                raise
            except OSError as inner:
                raise HostReadError(self.host.display(path), inner.strerror or str(inner)) from inner
        try:
            data = os.read(fd, MAX_ATTRIBUTE_BYTES + 1)
            # sysfs hands an attribute over in one read; a regular file (fixture, procfs) may need more.
            while data and len(data) <= MAX_ATTRIBUTE_BYTES:
                more = os.read(fd, MAX_ATTRIBUTE_BYTES + 1 - len(data))
                if not more:
                    break
                data += more
        except OSError as exc:
            raise HostReadError(self.host.display(path), exc.strerror or str(exc)) from exc
        finally:
            os.close(fd)
        if len(data) > MAX_ATTRIBUTE_BYTES:
            log.warning(
                "refused an oversized attribute",
                extra={"path": self.host.display(path), "limit_bytes": MAX_ATTRIBUTE_BYTES},
            )
            raise AttributeTooLarge(self.host.display(path), f"larger than {MAX_ATTRIBUTE_BYTES} bytes")
        return data.decode("utf-8", errors="replace").rstrip("\n")

    def read_opt(self, name: str) -> str | None:
        """An attribute that may legitimately be absent: None then. Unreadable is still an error."""
        try:
            return self.read(name)
        except FileNotFoundError:
            return None
