"""The demo's temporary directories against Ctrl-C and SIGTERM: made and removed whole, whenever a signal
lands. The demo stops on either signal at any moment (KeyboardInterrupt), and a directory it leaves
behind, or half removed, is litter in the user's /tmp, with a kubeconfig's token in it."""

from __future__ import annotations

import contextlib
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """SIGINT and SIGTERM are noted while the block runs and delivered again after it, to the handler
    that was in place (the demo's raise KeyboardInterrupt): one landing mid-block would stop it halfway,
    a directory made but not yet registered for removal, or removed in part and the rest left behind.
    Delivered after an exception in the block too, so that the stop asked for is not lost. A signal
    ignored (SIG_IGN) stays ignored; one whose handler was set from C (None, which Python cannot put
    back) is left as it is. Outside the main thread nothing is swapped: a signal's handler runs in the
    main thread only, so it cannot stop this block there, and setting one is refused (ValueError)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []

    def note(signum: int, _frame: object) -> None:
        noted.append(signum)

    before: dict[signal.Signals, Any] = {}
    try:
        for held in (signal.SIGINT, signal.SIGTERM):
            handler = signal.getsignal(held)
            if handler is not None and handler is not signal.SIG_IGN:
                before[held] = signal.signal(held, note)
        yield
    finally:
        for held, handler in before.items():
            signal.signal(held, handler)
        for landed in dict.fromkeys(noted):
            signal.raise_signal(landed)  # its handler runs here: the demo's raises KeyboardInterrupt


def removed_whole(path: str) -> None:
    """`path` removed to the last file, whatever signal lands meanwhile (raised once it is gone)."""
    with uninterrupted():
        shutil.rmtree(path, ignore_errors=True)


def made(stack: contextlib.ExitStack, prefix: str, parent: str | None = None) -> str:
    """A fresh temporary directory (in `parent`, else the system's), removed whole when `stack`
    closes: made and registered for removal in one uninterrupted step (TemporaryDirectory, or mkdtemp
    then try/finally, leave both windows open to a signal)."""
    with uninterrupted():
        path = tempfile.mkdtemp(prefix=prefix, dir=parent)
        stack.callback(removed_whole, path)
    return path


@contextlib.contextmanager
def directory(prefix: str, parent: str | None = None) -> Iterator[str]:
    """`made` as a context manager of its own: the directory removed whole when the block ends."""
    with contextlib.ExitStack() as stack:
        yield made(stack, prefix, parent)
