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
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    # A dot-name without the final suffix: a directory watcher (the runtime's CDI cache) ignores it.
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
