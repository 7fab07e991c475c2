"""Files the driver owns on the node (CDI specs, the checkpoint): read safely, written atomically.

A path we read may hold anything by the time we read it: a FIFO (opening one blocks a plain open
forever), a symlink, a directory, a huge file. So a read opens without following links and without
blocking, accepts only a regular file, and caps the size; a write goes to a temporary file in the same
directory, is synced, and renamed over the target, so a reader sees the old content or the new, never a
part of it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile


class NotRegularFile(OSError):
    pass


def read_regular(path: str, limit: int) -> bytes | None:
    """The file's bytes; None when absent. Raises NotRegularFile for anything but a regular file no
    larger than `limit`, and OSError when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW on a symlink
            raise NotRegularFile(f"{path} is a symlink") from exc
        raise
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"{path} is not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise NotRegularFile(f"{path} is larger than {limit} bytes")
    return data


def write_atomically(path: str, content: bytes, mode: int = 0o644, *, sync: bool = True) -> None:
    """Write `content` to `path` so a reader sees the old file or the new one, never a part. `sync`:
    the content is on disk before the rename (a power loss cannot leave the name on a torn file);
    without it the rename is still atomic for every reader while the machine stays up."""
    PendingFile(path, mode).replace(content, sync=sync)


class PendingFile:
    """The temporary file beside `path` that an atomic write renames over it, created ahead of the
    content: a caller that knows where it will write, but not yet what, may create it while it waits,
    and the write itself is then a write and a rename (a first prepare no longer does: with no sync
    before its answer, making it during the claim's read cost a thread hop and saved nothing).
    Exactly one of `replace` and `discard` ends it."""

    def __init__(self, path: str, mode: int = 0o644, *, make_directory: bool = True) -> None:
        """Raises OSError (FileNotFoundError for a missing directory without `make_directory`)."""
        directory = os.path.dirname(path)
        if make_directory:
            os.makedirs(directory, exist_ok=True)
        # A dot-name without the final suffix: a directory watcher (the runtime's CDI cache) ignores it.
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
        try:
            os.fchmod(fd, mode)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self.path = path
        self.tmp = tmp
        self._fd: int | None = fd

    def replace(self, content: bytes, *, sync: bool = False) -> None:
        """Write `content` and rename the file over `path` (see write_atomically for `sync`)."""
        fd, self._fd = self._fd, None
        if fd is None:
            raise ValueError(f"the pending file for {self.path} is already used")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(content)
                f.flush()
                if sync:
                    os.fsync(f.fileno())
            os.replace(self.tmp, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.tmp)
            raise

    def discard(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp)
