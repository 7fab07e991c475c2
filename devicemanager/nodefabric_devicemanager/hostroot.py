"""Reading a host's /sys, /dev and /proc from an explicit root, safely.

Every read resolves the symlink chain and refuses a path that lands outside the root (sysfs is a chain
of symlinks, so checking the spelled path proves nothing), and one attribute is capped at 64 KiB: an
oversized file is an error, never a truncated value that would parse as something else.

A read never blocks: an attribute is opened non-blocking (O_NONBLOCK, O_NOCTTY) and read at most one
byte past the cap, and a read that gives nothing, too much or an error asks fstat what answered: a FIFO,
a character device, a socket or a directory is refused by its type, so neither a FIFO nor /dev/zero can
hang a pass or pass for a value. A symlink is resolved, checked and refused by its target's type before
the target is opened. An attribute that is not UTF-8 is refused too (`NotText`): a value nobody can
decode is unknown, never published with U+FFFD in it.

Resolution is paid once per directory (`HostRoot.dir`, `child_link`), not once per attribute: an attribute
inside a resolved directory costs one O_NOFOLLOW open (a symlink answers ELOOP and takes the slow path), a
read, the read that hears EOF (asking for one byte: a byte more is read on to the cap), and a close; one
absent when read for its value is None from the failed open itself. A directory a pass lists is opened once
with O_NOFOLLOW (the open is its check) and listed through that descriptor, and the entry types of the listing
stand in for an lstat per child (`entries`, `child_entries_opt`, `listed_child`).

Where a pass holds a descriptor of a checked directory, it opens below it relative to that descriptor instead
of by the path from the root: a PCI function's attributes and `physfn` through the O_PATH descriptor that
resolved its link (`child_link_read`), a listed directory's entries' attributes through the descriptor it was
listed through (`child_listing_opt`, `Listing`), and a directory below a listed entry (an RDMA device's
`ports`) through a descriptor of the entry held relative to the listing (`Listing.held`,
`child_listing_opt(dir_fd=)`). The kernel walks one or two components instead of the whole path, and what is
read is the directory that was resolved or listed even if a component above it is swapped meanwhile. Whatever
does not open on that common path (absent, a link, a special file) takes the path-based steps, so the answers
and refusals are theirs; below a held or listed directory, a step that needs a directory of it only while its
path still names the directory held (`_names_held`): renamed away and replaced, it is refused, "the directory
changed while being read", never read through whatever was put at its name.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import logging
import os
import stat
from dataclasses import dataclass
from typing import NoReturn

log = logging.getLogger(__name__)

MAX_ATTRIBUTE_BYTES = 64 * 1024
# O_NONBLOCK: even a FIFO that slipped past the type check cannot block the open or the read.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
# A directory opened to be listed: O_NOFOLLOW makes the open refuse a link (ELOOP) and O_DIRECTORY
# anything else (ENOTDIR, before a FIFO or a device is opened), so a successful open is the type check.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# A listed entry held to read its attributes relative to it: resolution only, refusing a link or a file.
_ENTRY_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_LIMIT = MAX_ATTRIBUTE_BYTES + 1  # one byte more than allowed: an oversized file shows itself
_IFMT, _IFREG, _IFDIR, _IFLNK = stat.S_IFMT(0o177777), stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK


class HostReadError(OSError):
    """A read of the host that could not be answered. Never to be read as "absent"."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class Refused(HostReadError):
    """A path this reader will not read: what is there is not what the host should have there. Reported as
    refused, never as absent (an absent attribute is FileNotFoundError)."""


class PathEscapesRoot(Refused):
    pass


class AttributeTooLarge(Refused):
    pass


class NotRegularFile(Refused):
    """An attribute that is a FIFO, a device node, a socket or a directory: refused, never opened to block."""


class NotADirectory(Refused):
    """A directory entry (a listed interface, a PCI function, `device`) that is not a directory."""


class NotText(HostReadError):
    """An attribute whose bytes are not UTF-8: its value is unknown."""


_KINDS = {
    stat.S_IFIFO: "FIFO",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
    stat.S_IFSOCK: "socket",
    stat.S_IFDIR: "directory",
    stat.S_IFREG: "regular file",
    stat.S_IFLNK: "symlink",
}


def _not_text(exc: NotText) -> str | None:
    """`value`'s answer for an attribute that is not UTF-8: unknown, and the log says so."""
    log.warning("an attribute is not UTF-8 text; its value is unknown", extra={"path": exc.path})
    return None


def kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "special file")


def recorded_name(name: str) -> str:
    """A directory entry's name as the record can carry it: bytes that are not UTF-8 (os.listdir hands them
    over surrogate-escaped) are written `\\xNN`, since an API object holds UTF-8 text only."""
    if name.isascii():  # every name a kernel makes: no encoding to try
        return name
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


_NOT_COMPONENTS = frozenset({"", ".", ".."})
# Tuples of attribute names `_attributes` has checked to be single path components: the callers' own
# constants, checked once rather than on every call of a pass; bounded, as a caller could pass any.
_CHECKED_NAMES: set[tuple[str, ...]] = set()
_CHECKED_NAMES_MAX = 64
_FD_LINKS = "/proc/self/fd"
_DELETED = " (deleted)"  # what the kernel appends to /proc/self/fd/N of a removed directory
_HAVE_FD_LINKS = os.path.isdir(_FD_LINKS)


def _check_names(names: tuple[str, ...]) -> None:
    """ValueError unless each of `names` is a single path component; remembered in `_CHECKED_NAMES`."""
    for name in names:
        if "/" in name or name in _NOT_COMPONENTS:
            raise ValueError(f"not a single path component: {name!r}")
    if len(_CHECKED_NAMES) < _CHECKED_NAMES_MAX:
        _CHECKED_NAMES.add(names)


def _names_held(path: str, fd: int) -> bool:
    """Whether `path` still names the directory `fd` holds (the same inode, reached without a link at its
    end): what a path-based step below a held or listed directory must know before it reads by path, since
    a component of `path` swapped since (the directory renamed away and a link out of the root put at its
    name) would have the path name somewhere else than what was held. FileNotFoundError when it names
    nothing (hot-unplug): what is below it is absent, for the caller to say so without reading by path."""
    try:
        named, held = os.lstat(path), os.fstat(fd)
    except FileNotFoundError:
        raise
    except OSError:
        return False
    return named.st_ino == held.st_ino and named.st_dev == held.st_dev


def _changed(shown: str) -> HostReadError:
    log.warning("refused a directory that changed while being read", extra={"path": shown})
    return HostReadError(shown, "the directory changed while being read")


def _realpath(path: str) -> tuple[str, os.stat_result | None]:
    """os.path.realpath, and the stat of what it names (None when it does not resolve), letting the kernel
    walk the chain when it can: one open(O_PATH), one readlink and one fstat instead of an lstat per
    component in Python, several times faster over sysfs' deep link chains."""
    if _HAVE_FD_LINKS:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            # Absent, dangling or looping: realpath gives the same answer it always did (and the same
            # refusal when the dangling target lies outside the root).
            return os.path.realpath(path), None
        try:
            return os.readlink(f"{_FD_LINKS}/{fd}"), os.fstat(fd)
        except OSError:
            return os.path.realpath(path), None
        finally:
            os.close(fd)
    resolved = os.path.realpath(path)
    try:
        return resolved, os.stat(resolved)
    except OSError:
        return resolved, None


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
        return self.resolve_stat(path)[0]

    def resolve_stat(self, path: str) -> tuple[str, os.stat_result | None]:
        """`resolve`, and the stat of where it lands (None when the chain dangles or loops)."""
        resolved, st = _realpath(path)
        if not self.contains(resolved):
            log.warning(
                "refused a path that resolves outside the host root",
                extra={"path": self.display(path), "target": resolved, "root": self.root},
            )
            raise PathEscapesRoot(self.display(path), f"resolves to {resolved}, outside {self.root}")
        return resolved, st

    def dir(self, path: str) -> SysDir:
        """A resolved directory from a host-absolute path."""
        return SysDir(self, self.resolve(self.host_path(path)))

    def present(self, path: str) -> bool:
        """Whether anything is at a host path, a broken or escaping link included: the question to ask
        before concluding a part of the host is absent (a refused path is not an absent one). Only
        ENOENT is absence: a path whose way there loops (`sys/class -> class`) or cannot be searched is
        there and refused when read, where os.path.lexists would call it absent."""
        try:
            os.lstat(self.host_path(path))
        except FileNotFoundError:
            return False
        except OSError:
            return True
        return True

    def exists(self, path: str) -> bool:
        try:
            self.resolve(self.host_path(path))
        except PathEscapesRoot:
            return False
        return os.path.exists(self.host_path(path))


def _entries(directory: str | int, host: HostRoot, path: str) -> list[tuple[str, bool]]:
    """The entry names of the directory at `path` (listed through `directory`: the path or a descriptor of
    it), sorted, each with whether the listing saw a real directory there; HostReadError when it cannot
    be listed."""
    try:
        with os.scandir(directory) as it:
            return sorted([(e.name, e.is_dir(follow_symlinks=False)) for e in it])
    except OSError as exc:
        raise HostReadError(host.display(path), exc.strerror or str(exc)) from exc


class PathReads:
    """How one path under the host root is read: an attribute opened, read and refused by what it is,
    a symlink resolved and checked. `SysDir` names the paths; this reads them."""

    __slots__ = ("host",)

    host: HostRoot

    def _lstat(self, path: str) -> os.stat_result:
        """The entry itself. FileNotFoundError when it is absent (or vanished: hot-unplug); any other
        failure is HostReadError."""
        try:
            return os.lstat(path)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise HostReadError(self.host.display(path), exc.strerror or str(exc)) from exc

    def _through_link(self, path: str) -> tuple[str, os.stat_result]:
        """Where the symlink at `path` lands, and its stat.

        FileNotFoundError only when the link itself went away (hot-unplug). A symlink that leaves the
        root, dangles or loops is HostReadError: a broken link is not a missing entry.
        """
        target, target_st = self.host.resolve_stat(path)
        if target_st is not None:
            return target, target_st
        if not os.path.lexists(path):
            raise FileNotFoundError(errno.ENOENT, "vanished while being read", path)  # the link went away
        try:
            os.stat(path)
        except OSError as exc:
            reason = exc.strerror or str(exc)
        else:
            reason = "it changed while being read"
        raise HostReadError(self.host.display(path), f"symlink does not resolve: {reason}")

    def _read(self, path: str) -> str:
        # The hot path of a pass (one call per attribute): open, read, the read that hears EOF, close.
        # O_NOFOLLOW makes the open itself the symlink check (a link answers ELOOP and takes `_open_slow`,
        # which resolves it, checks it lands inside the root and refuses a target that is not a regular
        # file before opening it); the directory part of `path` is already resolved and checked.
        # `_attributes` inlines the common case of this; anything else it hands to `_read_rest`.
        try:
            fd = os.open(path, _READ_FLAGS)
        except OSError as exc:
            path, fd = self._open_slow(path, exc)
        return self._read_rest(path, fd, None)

    def _read_rest(self, path: str, fd: int, data: bytes | None) -> str:
        """The rest of `_read` once `fd` is open (it is closed here): `data` is what the reads so far gave
        (None: nothing read yet)."""
        try:
            # No lstat before the open and no fstat after it on the common path: O_NONBLOCK keeps a FIFO's
            # open and reads from waiting for a writer, O_NOCTTY keeps a terminal from becoming ours, and
            # the read is capped. sysfs hands an attribute over in one read (a file on a disk or in procfs
            # may need more), so the loop asks until EOF.
            if data is None:
                data = os.read(fd, _READ_LIMIT)
            got = len(data)
            while 0 < got <= MAX_ATTRIBUTE_BYTES:
                more = os.read(fd, _READ_LIMIT - got)
                if not more:
                    break
                data += more
                got = len(data)
            if not got or got > MAX_ATTRIBUTE_BYTES:
                # Nothing or too much: the fstat says whether a regular file answered so or something
                # that is not one (a FIFO without a writer, /dev/null, /dev/zero), refused as before.
                self._refuse_special(fd, path)
        except OSError as exc:
            if isinstance(exc, HostReadError):
                raise
            self._read_failed(path, fd, exc)
        finally:
            os.close(fd)
        # What is given up by not asking fstat on every read: a FIFO whose writer already wrote a short
        # value and left, or a device node planted under an attribute's own name (root only; sysfs has
        # neither) that gives a short value and EOF, reads as that value, which is no more invented than
        # the same bytes in a regular file the same writer could have put there.
        if got > MAX_ATTRIBUTE_BYTES:
            log.warning(
                "refused an oversized attribute",
                extra={"path": self.host.display(path), "limit_bytes": MAX_ATTRIBUTE_BYTES},
            )
            raise AttributeTooLarge(self.host.display(path), f"larger than {MAX_ATTRIBUTE_BYTES} bytes")
        return self._text(path, data)

    def _read_failed(self, path: str, fd: int, exc: OSError) -> NoReturn:
        """A read of open `fd` that failed: a directory (EISDIR), a FIFO or terminal with nothing to give
        (EAGAIN), or a regular file the host would not hand over. Refused by what answered, else
        HostReadError. The caller closes `fd`."""
        self._refuse_special(fd, path)
        raise HostReadError(self.host.display(path), exc.strerror or str(exc)) from exc

    def _text(self, path: str, data: bytes) -> str:
        try:
            return data.decode("utf-8").rstrip("\n")
        except UnicodeDecodeError as exc:
            raise NotText(self.host.display(path), f"not UTF-8 text (byte {exc.start})") from exc

    def _attributes(
        self, prefix: str, names: tuple[str, ...], lenient: bool, dir_fd: int | None = None
    ) -> builtins.list[str | None]:
        """`_read(prefix + name)` for each of `names` (each checked to be a single path component), with
        the common case inline: one open, a read that gives a value, the read that hears EOF, a close.
        Anything else takes `_read`'s own steps from where this left off (`_open_slow` for an open that
        failed, `_read_rest` for reads that gave nothing, too much or more), so every answer and refusal
        is `_read`'s.
        `lenient` is `values`' reading: absent (FileNotFoundError) and not UTF-8 (NotText, logged) are
        None; otherwise they raise.
        `dir_fd`: a descriptor of the directory `prefix` names (resolved and checked, or held by
        `Listing` without following a link): the common case opens `name` relative to it (no path walk
        from the root, and the very directory that was checked), an open that fails takes `_open_slow`
        by path as without it."""
        if names not in _CHECKED_NAMES:
            _check_names(names)
        out: builtins.list[str | None] = []
        for name in names:
            path = prefix + name
            try:
                try:
                    if dir_fd is None:
                        fd = os.open(path, _READ_FLAGS)
                    else:
                        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
                except OSError as exc:
                    if lenient and isinstance(exc, FileNotFoundError):
                        out.append(None)  # absent: None at once, no other exception raised to say so
                        continue
                    path, fd = self._open_slow(path, exc, dir_fd is not None)
                    out.append(self._read_rest(path, fd, None))
                    continue
                try:
                    data = os.read(fd, _READ_LIMIT)
                    # The read that hears EOF asks for one byte: a byte more takes `_read_rest`, which
                    # reads on to the cap, so the answer is the same, and the interpreter does not
                    # allocate (and free) a 64 KiB buffer for the nothing it hears.
                    more = os.read(fd, 1) if 0 < len(data) <= MAX_ATTRIBUTE_BYTES else None
                except OSError as exc:
                    try:
                        self._read_failed(path, fd, exc)
                    finally:
                        os.close(fd)
                except BaseException:
                    # Not the host's answer (MemoryError, KeyboardInterrupt mid-read): out it goes, but
                    # not with the descriptor left open. A clause, not a finally: the common case closes
                    # the descriptor itself below, and costs nothing more for this.
                    os.close(fd)
                    raise
                if more != b"":
                    out.append(self._read_rest(path, fd, data if more is None else data + more))
                    continue
                os.close(fd)  # a value, then EOF: the common case
                try:
                    out.append(data.decode("utf-8").rstrip("\n"))
                except UnicodeDecodeError:
                    out.append(self._text(path, data))  # raises NotText
            except FileNotFoundError:
                if not lenient:
                    raise
                out.append(None)
            except NotText as exc:
                if not lenient:
                    raise
                out.append(_not_text(exc))
        return out

    def _refuse_special(self, fd: int, path: str) -> None:
        """Refuse what `fd` is when it is not a regular file; a regular file (or a failed fstat) returns."""
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            return
        if mode & _IFMT != _IFREG:
            self._refuse(path, mode)

    def _open_slow(self, path: str, failed: OSError, relative: bool = False) -> tuple[str, int]:
        """The open of an attribute that did not open as a plain file: absent (FileNotFoundError), a
        symlink (resolved, checked, and opened only when it lands on a regular file inside the root), a
        socket or other special file (refused), or unreadable (HostReadError). Returns the path opened
        (the symlink's target) and its descriptor. `relative`: `failed` is an open relative to a
        directory descriptor, which names only the attribute."""
        if isinstance(failed, FileNotFoundError):
            if relative:  # absent, named by its whole path as an open by path names it
                raise FileNotFoundError(failed.errno, failed.strerror, path)
            raise failed
        mode = self._lstat(path).st_mode
        if mode & _IFMT == _IFLNK:
            path, st = self._through_link(path)
            mode = st.st_mode
        elif mode & _IFMT == _IFREG:
            raise HostReadError(self.host.display(path), failed.strerror or str(failed)) from failed
        # The type is checked before the target is opened: opening a FIFO could wait, and opening some
        # device nodes acts (a watchdog arms).
        if mode & _IFMT != _IFREG:
            self._refuse(path, mode)
        try:
            return path, os.open(path, _READ_FLAGS)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise HostReadError(self.host.display(path), exc.strerror or str(exc)) from exc

    def _refuse(self, path: str, mode: int) -> NoReturn:
        shown = self.host.display(path)
        log.warning(
            "refused an attribute that is not a regular file", extra={"path": shown, "kind": kind(mode)}
        )
        raise NotRegularFile(shown, f"is a {kind(mode)}, not a regular file")


class SysDir(PathReads):
    """A directory whose path is resolved and known to lie inside the host root. Immutable by contract.

    A plain slotted class, not a frozen dataclass: a pass makes one per directory it steps into (9,000 on
    an 8 PF x 128 VF node), and a frozen dataclass's __init__ (object.__setattr__ per field, then
    __post_init__) was 8% of a walk's profile.
    """

    __slots__ = ("_prefix", "path")

    def __init__(self, host: HostRoot, path: str) -> None:
        self.host = host
        self.path = path
        # "<path>/", computed once: every attribute of a pass is spelled from it.
        self._prefix = path if path.endswith("/") else path + "/"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SysDir):
            return NotImplemented
        return self.path == other.path and self.host == other.host

    def __hash__(self) -> int:
        return hash((self.host, self.path))

    def __repr__(self) -> str:
        return f"SysDir(host={self.host!r}, path={self.path!r})"

    @property
    def name(self) -> str:
        return self.path.rpartition("/")[2]

    @property
    def shown(self) -> str:
        return self.host.display(self.path)

    def _child_path(self, name: str) -> str:
        if "/" in name or name in _NOT_COMPONENTS:
            raise ValueError(f"not a single path component: {name!r}")
        # Plain concatenation onto the resolved path: this runs for every attribute of a pass, where
        # os.path.join's generality is a measurable cost.
        return self._prefix + name

    def child(self, name: str) -> SysDir:
        """A subdirectory or a symlink to one (e.g. "device", "physfn"), resolved and checked.

        FileNotFoundError only when the entry itself is absent; a symlink that dangles, loops or leaves
        the root, and an entry that is not a directory, are HostReadError: a broken link is not a missing
        device.
        """
        path = self._child_path(name)
        st = self._lstat(path)
        mode = st.st_mode
        if mode & _IFMT == _IFDIR:  # a real directory: nothing to resolve (the common case, inline)
            return SysDir(self.host, path)
        if mode & _IFMT == _IFLNK:
            path, st = self._through_link(path)
            mode = st.st_mode
        if mode & _IFMT != _IFDIR:
            raise NotADirectory(self.host.display(path), f"is a {kind(mode)}, not a directory")
        return SysDir(self.host, path)

    def child_opt(self, name: str) -> SysDir | None:
        try:
            return self.child(name)
        except FileNotFoundError:
            return None

    def child_link(self, name: str) -> SysDir:
        """`child` for an entry the kernel makes a symlink (`/sys/bus/pci/devices/<bdf>`, `/sys/class/net/
        <if>`, `device`): the kernel resolves it at once, without the lstat `child` pays to learn whether
        it is a link. The same checks hold (inside the root, a directory); anything else (absent,
        dangling, looping, outside the root, not a directory, no /proc) takes `child` for its exact
        answer and refusal."""
        held = self._held_link(name)
        if held is None:
            return self.child(name)
        os.close(held[0])
        return held[1]

    def _held_link(self, name: str) -> tuple[int, SysDir] | None:
        """The entry resolved by the kernel: an O_PATH descriptor of the directory it lands on (the
        caller closes it) and that directory; None where `child_link`'s common case does not hold
        (absent, dangling, looping, outside the root, not a directory, gone since, no /proc), for the
        caller to take `child`'s steps."""
        if not _HAVE_FD_LINKS:
            return None
        try:
            # O_DIRECTORY: the kernel refuses what is not a directory, so no fstat is needed to ask.
            fd = os.open(self._child_path(name), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            resolved = os.readlink(f"{_FD_LINKS}/{fd}")
        except OSError:
            resolved = ""
        except BaseException:
            os.close(fd)
            raise
        # " (deleted)": the directory went away after the open (hot-unplug); child() says it is gone.
        if resolved and self.host.contains(resolved) and not resolved.endswith(_DELETED):
            return fd, SysDir(self.host, resolved)
        os.close(fd)
        return None

    def child_link_read(
        self, name: str, attributes: tuple[str, ...], link: str
    ) -> tuple[SysDir, builtins.list[str | None] | None, str | None]:
        """`child_link(name)`, then that directory's `values(attributes)` and `link_name(link)`, in one
        step: the descriptor that resolved the entry stays open while they are read through it (opens
        relative to it: no path walk per attribute, and what is read is the directory whose resolved
        path was checked, even if a component of that path is swapped meanwhile). Anything child_link's
        common case does not take (absent, dangling, looping, outside the root, not a directory, no
        /proc) takes child_link, values and link_name by path for their exact answers and refusals.
        A link that lands on a directory of another name (`bus/devices/A` -> `.../B`) is resolved but
        not read: values None, for the caller to refuse before anything of it is read."""
        held = self._held_link(name)
        if held is not None:
            fd, d = held
            try:
                if d.name != name:
                    return d, None, None
                return d, d._attributes(d._prefix, attributes, True, fd), d.link_name(link, dir_fd=fd)
            finally:
                os.close(fd)
        d = self.child(name)
        if d.name != name:
            return d, None, None
        return d, d.values(attributes), d.link_name(link)

    def child_link_opt(self, name: str) -> SysDir | None:
        try:
            return self.child_link(name)
        except FileNotFoundError:
            return None

    def listed_child(self, name: str, is_dir: bool) -> SysDir:
        """`child` for an entry a listing of this directory has just seen (`entries`, `child_entries_opt`):
        one it saw as a real directory is taken as one, without the lstat `child` pays to ask again (the
        answer is as old as an lstat's would be by the time anything is read through it); any other
        entry (a symlink, a file, an unknown type) takes `child` for its exact answer and refusal."""
        if not is_dir:
            return self.child(name)
        return SysDir(self.host, self._child_path(name))

    def child_entries_opt(self, name: str) -> tuple[SysDir, list[tuple[str, bool]]] | None:
        """`child_opt(name)` and its `entries()` at once: the directory is opened once (O_NOFOLLOW, so
        the open itself says it is a real directory and not a link) and listed through that descriptor.
        None when it is absent; a link, a file or anything else takes `child` and `entries` for the
        exact answer and refusal (a link that resolves inside the root is followed, as `child` does)."""
        listing = self.child_listing_opt(name)
        if listing is None:
            return None
        listing.close()  # only the listing was asked for
        return listing.dir, listing.entries

    def child_listing_opt(self, name: str, dir_fd: int | None = None) -> Listing | None:
        """`child_entries_opt(name)`, with the descriptor it listed the directory through kept open (until
        the `Listing` is closed: use it in `with`) for reading its entries' attributes relative to it
        (`Listing.values`, `Listing.reads`). None when it is absent; a link, a file or anything else
        takes `child` and `entries` for the exact answer and refusal, and its entries are read by path.
        `dir_fd`: a descriptor of this directory (`Listing.held`), to open `name` relative to: one
        component for the kernel to walk, in the very directory that was held, instead of the whole
        path from the root, whose components could have been swapped for links since."""
        path = self._child_path(name)
        try:
            fd = os.open(path, _DIR_FLAGS) if dir_fd is None else os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError:
            # Not a directory to open (a link, a file, a FIFO, unreadable): `child`'s steps, by path. Below a
            # held directory, only while its path still names it: once renamed away (a link out of the root
            # at its name), `<path>/<name>` is no longer what the held directory has.
            try:
                if dir_fd is not None and not _names_held(self.path, dir_fd):
                    raise _changed(self.shown) from None
            except FileNotFoundError:
                return None  # gone (hot-unplug): nothing below it, and nothing read by its path
            found = self.child_opt(name)
            return None if found is None else Listing(found, found.entries(), None)
        try:
            return Listing(SysDir(self.host, path), _entries(fd, self.host, path), fd)
        except BaseException:
            os.close(fd)
            raise

    def has(self, name: str) -> bool:
        return os.path.lexists(self._child_path(name))

    def is_dir(self) -> bool:
        return os.path.isdir(self.path)

    def not_a_directory(self) -> str:
        """Why is_dir said no, in the kernel's words where it has them ("Too many levels of symbolic
        links" for a loop, rather than a plain "not a directory")."""
        try:
            os.stat(self.path)
        except OSError as exc:
            return exc.strerror or str(exc)
        return "is not a directory"

    def list(self) -> list[str]:
        """Entry names, sorted: sysfs directory order is not stable and everything built on it is compared."""
        try:
            return sorted(os.listdir(self.path))
        except OSError as exc:
            raise HostReadError(self.shown, exc.strerror or str(exc)) from exc

    def entries(self) -> builtins.list[tuple[str, bool]]:
        """`list`, each name with whether the listing saw a real directory there (not a link to one):
        what `listed_child` takes instead of an lstat per entry. sysfs fills in every entry's type."""
        return _entries(self.path, self.host, self.path)

    def link_target(self, name: str) -> str | None:
        """A symlink's target as written, unresolved; None when the entry cannot be read as a link (absent,
        not a link, unreadable). A hint for a caller that checks it against what it already resolved,
        never an answer by itself."""
        try:
            return os.readlink(self._child_path(name))
        except OSError:
            return None

    def link_name(self, name: str, *, dir_fd: int | None = None) -> str | None:
        """The last component of a symlink's target ("driver" -> "mlx5_core"), without following it.
        `dir_fd`: a descriptor of this directory, to read the link relative to (`child_link_read`)."""
        path = self._child_path(name)
        try:
            target = os.readlink(path) if dir_fd is None else os.readlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.EINVAL:  # not a symlink
                return None
            raise HostReadError(self.host.display(path), exc.strerror or str(exc)) from exc
        return target.rpartition("/")[2]

    def read(self, name: str) -> str:
        """One attribute, stripped of its trailing newline. Raises FileNotFoundError when absent,
        HostReadError when it is refused (outside the root, not a regular file, too large, not UTF-8) or
        cannot be read."""
        return self._read(self._child_path(name))

    def read_opt(self, name: str) -> str | None:
        """An attribute that may legitimately be absent: None then. Unreadable is still an error."""
        path = self._child_path(name)
        try:
            return self._read(path)
        except FileNotFoundError:
            return None

    def value(self, name: str) -> str | None:
        """An attribute read for its value: None when absent or not UTF-8 (the value is unknown, and says
        so in the log). Refused or unreadable is still an error: never reported as absent."""
        return self.values((name,))[0]

    # `builtins.list`: inside this class, `list` is the method.
    def values(self, names: tuple[str, ...]) -> builtins.list[str | None]:
        """`value` of each of `names`, in order, in one call: what a pass reads together from one
        directory (a function's ids, an interface's mtu, operstate and flags). The first that is refused
        or unreadable raises, as `value` would."""
        return self._attributes(self._prefix, names, True)

    def reads(self, names: tuple[str, ...]) -> builtins.list[str]:
        """`read` of each of `names`, in order, in one call (a port's state and phys_state): the first
        that is absent, refused, unreadable or not UTF-8 raises, as `read` would."""
        return self._attributes(self._prefix, names, False)  # type: ignore[return-value]


class Listing:
    """A directory (`dir`) and its sorted `entries`, listed through a descriptor that stays open until
    `close` (or the end of a `with`): an entry the listing saw as a real directory is opened relative
    to that descriptor (O_PATH, O_NOFOLLOW: still a real directory, not a link put in its place since)
    and its attributes relative to that (one component each, not the whole path from the root, in the
    directory that was listed even if a component above it is swapped meanwhile). One that is a link or
    a file by then, any other entry, and every entry of a directory reached through a link (no
    descriptor), is read as `dir.listed_child(entry)` reads it, by path; the answers and refusals are
    the same. One gone by then has each attribute absent."""

    __slots__ = ("_fd", "dir", "entries")

    def __init__(self, directory: SysDir, entries: list[tuple[str, bool]], fd: int | None) -> None:
        self.dir = directory
        self.entries = entries
        self._fd = fd

    def __enter__(self) -> Listing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def _check_named(self) -> None:
        """Before an entry is read by path: HostReadError unless `dir.path` still names the directory that
        was listed (its descriptor), for a path through a directory renamed away and replaced (by a link
        out of the root) reads what was never listed; FileNotFoundError when it names nothing now (the
        entry is as absent as a read by path would find it). Nothing to check without a descriptor."""
        if self._fd is not None and not _names_held(self.dir.path, self._fd):
            raise _changed(self.dir.shown)

    def values(self, name: str, is_dir: bool, names: tuple[str, ...]) -> tuple[SysDir, list[str | None]]:
        """The entry (`dir.listed_child(name, is_dir)`) and its `values(names)`."""
        return self._read(name, is_dir, names, True)

    def reads(self, name: str, is_dir: bool, names: tuple[str, ...]) -> list[str]:
        """The `reads(names)` of the entry (`dir.listed_child(name, is_dir)`)."""
        return self._read(name, is_dir, names, False)[1]  # type: ignore[return-value]

    def held(self, name: str, is_dir: bool) -> tuple[SysDir, int | None]:
        """The entry (`dir.listed_child(name, is_dir)`) and, where the listing saw a real directory, a
        descriptor of it opened relative to the listing's (O_PATH, O_NOFOLLOW: still a real directory,
        not a link put in its place since), for the caller to open below it relative to that (and to
        close); None where it is read by path: no descriptor to list through, an entry that is a link or
        a file (by now), which takes `listed_child`'s checks and refusals, or one gone since the listing,
        read by path as before (what is below it is absent)."""
        d = self.dir
        if is_dir and self._fd is not None:
            child = SysDir(d.host, d._child_path(name))  # the name checked before it is opened
            try:
                return child, os.open(name, _ENTRY_FLAGS, dir_fd=self._fd)
            except FileNotFoundError:
                # Gone from what was listed: read by path (what is below it is absent) only while the
                # path still names what was listed (or nothing: unplugged), not a link out of the root
                # put in its place.
                with contextlib.suppress(FileNotFoundError):
                    self._check_named()
                return child, None
            except OSError:
                is_dir = False  # a link, a file now: `child`'s checks and refusals
        self._check_named()
        return d.listed_child(name, is_dir), None

    def _read(
        self, name: str, is_dir: bool, names: tuple[str, ...], lenient: bool
    ) -> tuple[SysDir, list[str | None]]:
        d = self.dir
        if is_dir and self._fd is not None:
            child = SysDir(d.host, d._child_path(name))  # the name checked before it is opened
            # The entry is opened itself (O_PATH, O_NOFOLLOW: no link is followed) and its attributes
            # relative to that: `<entry>/<attribute>` in one open would follow a link put in place of
            # the entry since the listing, O_NOFOLLOW sparing only the last component.
            try:
                fd = os.open(name, _ENTRY_FLAGS, dir_fd=self._fd)
            except FileNotFoundError:
                # Gone from the directory that was listed: each attribute absent, named by its whole path
                # (nothing more is opened through a name that is not there: it could be back as a link).
                if names not in _CHECKED_NAMES:
                    _check_names(names)
                if lenient:
                    return child, [None] * len(names)
                if not names:
                    return child, []
                absent = child._prefix + names[0]
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), absent) from None
            except OSError:
                is_dir = False  # a link, a file now: `child`'s checks and refusals
            else:
                try:
                    return child, child._attributes(child._prefix, names, lenient, fd)
                finally:
                    os.close(fd)
        self._check_named()
        child = d.listed_child(name, is_dir)
        return child, child._attributes(child._prefix, names, lenient)
