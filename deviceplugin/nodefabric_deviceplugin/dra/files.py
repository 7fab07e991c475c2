"""Files the driver owns on the node (CDI specs, the checkpoint): read safely, written atomically.

A path we read may hold anything by the time we read it: a FIFO (opening one blocks a plain open
forever), a symlink, a directory, a huge file. So a read opens without following links and without
blocking, accepts only a regular file, and caps the size; a write goes to a new temporary file in the
same directory (synced when the caller needs it to survive a power loss) and is renamed over the target,
so a reader sees the old content or the new, never a part of it. A write costs a handful of system calls
(create, chmod, write, close, rename): it runs on every first prepare, on the thread kubelet waits for.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import stat
from typing import Any

# `json.dumps(x, sort_keys=True)` without a new encoder made per call: the spec and the checkpoint entry
# are encoded on every first prepare, on the thread kubelet waits for.
SORTED_JSON = json.JSONEncoder(sort_keys=True)


class NotRegularFile(OSError):
    pass


def parse_json(data: bytes) -> Any:
    """`json.loads`, raising ValueError for whatever is not JSON. A document nested deeper than the
    interpreter's recursion limit (`[[[[...`, well under any size cap) makes json raise RecursionError,
    which callers that set garbage aside, or write a spec again over it, would not catch: the driver would
    not start, or the claim would fail for good."""
    try:
        return json.loads(data)
    except RecursionError as exc:
        raise ValueError("nested too deeply to be a file of ours") from exc


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


def write_all(fd: int, data: bytes) -> None:
    """Write every byte (a short write is resumed, not lost). Raises OSError."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# O_EXCL|O_NOFOLLOW: a new file or none; never a file, a symlink or a FIFO that was already there.
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_ATTEMPTS = 100  # names taken meanwhile; each try is a fresh random name


def _temporary(path: str, mode: int) -> tuple[int, str]:
    """A new file beside `path`, with `mode` whatever the umask, open for writing, under a dot-name with
    a `.tmp` suffix (`.<name>.<random>.tmp`: a directory watcher, the runtime's CDI cache among them,
    skips it, and the checkpoint's start deletes it). The directory is made only when the create says it
    is missing: the first write, or one after it was removed. Raises OSError."""
    directory, name = os.path.split(path)
    made = False
    for _ in range(_ATTEMPTS):
        tmp = os.path.join(directory, f".{name}.{random.getrandbits(48):012x}.tmp")
        try:
            fd = os.open(tmp, _CREATE, mode)
        except FileExistsError:
            continue  # a leftover, or something planted there: left alone, another name taken
        except FileNotFoundError:
            if made:
                raise  # removed again as soon as made: not ours to fight over
            os.makedirs(directory or ".", exist_ok=True)
            made = True
            continue
        try:
            os.fchmod(fd, mode)  # the umask narrowed what open gave it
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return fd, tmp
    raise FileExistsError(errno.EEXIST, f"no free temporary name beside {path} in {_ATTEMPTS} tries")


def write_atomically(path: str, content: bytes, mode: int = 0o644, *, sync: bool = True) -> None:
    """Write `content` to `path` so a reader sees the old file or the new one, never a part: written to
    a temporary file beside it (see `_temporary`) and renamed over it. `sync`: the content is on disk
    before the rename (a power loss cannot leave the name on a torn file); without it the rename is
    still atomic for every reader while the machine stays up. Raises OSError, leaving no temporary
    file behind."""
    fd, tmp = _temporary(path, mode)
    try:
        try:
            write_all(fd, content)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
