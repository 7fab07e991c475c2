"""The demo's temporary directory against a signal at the worst moment: while it is made, and while it is
removed. The signal is sent from inside the file operation itself (the process signals itself from a
wrapped os call), so it lands exactly there on every run rather than when a timer happens to fire."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nodefabric_operator.demo import temporary


@pytest.fixture
def ctrl_c_handlers():
    """SIGINT and SIGTERM as the demo sets them (both raise KeyboardInterrupt), given back afterwards."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    for signum in before:
        signal.signal(signum, signal.default_int_handler)
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


def _tree(root: Path, files: int = 40) -> Path:
    for n in range(files):
        sub = root / f"d{n % 4}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"f{n}").write_text("x")
    return root


def _signal_on_call(
    monkeypatch: pytest.MonkeyPatch, name: str, after: int, signum: int = signal.SIGTERM
) -> list[int]:
    """os.<name> sends this process `signum` on its `after`-th call; the returned list counts calls."""
    real: Callable[..., Any] = getattr(os, name)
    calls: list[int] = []

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        calls.append(1)
        if len(calls) == after:
            os.kill(os.getpid(), signum)  # handled at the next bytecode, still inside the removal
        return result

    monkeypatch.setattr(os, name, wrapped)
    return calls


def test_a_signal_mid_rmtree_leaves_files_behind(tmp_path, monkeypatch, ctrl_c_handlers):
    """Why the removal is guarded: plain rmtree stops where the signal lands (ignore_errors covers
    OSError only), the rest of the tree left on disk."""
    root = _tree(tmp_path / "work")
    _signal_on_call(monkeypatch, "unlink", after=5)
    with pytest.raises(KeyboardInterrupt):
        shutil.rmtree(root, ignore_errors=True)
    assert root.exists() and any(root.rglob("f*"))


def test_removed_whole_finishes_the_removal_then_raises(tmp_path, monkeypatch, ctrl_c_handlers):
    root = _tree(tmp_path / "work")
    calls = _signal_on_call(monkeypatch, "unlink", after=5)
    with pytest.raises(KeyboardInterrupt):
        temporary.removed_whole(str(root))
    assert len(calls) == 40, "every file was removed after the signal"
    assert not root.exists()
    assert signal.getsignal(signal.SIGTERM) is signal.default_int_handler, "the handler was given back"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_signal_while_the_workdir_is_made_still_removes_it(tmp_path, monkeypatch, ctrl_c_handlers):
    """SIGTERM right after mkdir, before the directory is registered for removal: with
    TemporaryDirectory the directory would be made and never removed; here it is removed whole when the
    stack closes, and the signal raised once it is registered."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    _signal_on_call(monkeypatch, "mkdir", after=1)
    with pytest.raises(KeyboardInterrupt), contextlib.ExitStack() as stack:
        temporary.made(stack, "nodefabric-demo-")
        pytest.fail("the signal is raised before the path is handed back")
    assert os.listdir(tmp_path) == []


def test_uninterrupted_without_a_signal_changes_nothing(tmp_path, ctrl_c_handlers):
    with contextlib.ExitStack() as stack:
        workdir = Path(temporary.made(stack, "nodefabric-demo-"))
        assert workdir.is_dir() and workdir.name.startswith("nodefabric-demo-")
        assert oct(workdir.stat().st_mode & 0o777) == oct(0o700), "only its owner reads the kubeconfig"
        _tree(workdir)
    assert not workdir.exists()
    assert signal.getsignal(signal.SIGTERM) is signal.default_int_handler


def test_removed_whole_from_another_thread_removes_the_tree(tmp_path):
    """Signal handlers are the main thread's alone (setting one elsewhere is a ValueError, which left
    the whole tree behind); a signal cannot stop a removal in another thread, so there it runs as is."""
    root = _tree(tmp_path / "work")
    failed: list[BaseException] = []

    def remove() -> None:
        try:
            temporary.removed_whole(str(root))
        except BaseException as err:
            failed.append(err)

    thread = threading.Thread(target=remove)
    thread.start()
    thread.join()
    assert failed == []
    assert not root.exists()


def test_an_ignored_sigint_stays_ignored_through_the_removal(tmp_path, monkeypatch, ctrl_c_handlers):
    """A demo started with SIGINT ignored (in the background of a script: the shell ignores it there)
    is not stopped by one landing mid-removal: the removal finishes and nothing is raised."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    root = _tree(tmp_path / "work")
    _signal_on_call(monkeypatch, "unlink", after=5, signum=signal.SIGINT)
    temporary.removed_whole(str(root))
    assert not root.exists()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_a_signal_noted_in_a_block_that_fails_is_not_lost(ctrl_c_handlers):
    """A signal noted, then an error inside the block: the stop asked for still comes
    (KeyboardInterrupt, the error its context), not the error alone, which a caller might handle and
    carry on."""
    with pytest.raises(KeyboardInterrupt) as stopped, temporary.uninterrupted():
        os.kill(os.getpid(), signal.SIGTERM)
        raise OSError("no space left on device")
    assert isinstance(stopped.value.__context__, OSError)
    assert signal.getsignal(signal.SIGTERM) is signal.default_int_handler


def test_a_temporary_directory_in_a_given_parent_is_made_and_removed_whole(
    tmp_path, monkeypatch, ctrl_c_handlers
):
    """The story's device-plugin socket directory (in /tmp there, for short socket paths) is made as
    the work directory is: a signal right after mkdir still leaves nothing behind."""
    _signal_on_call(monkeypatch, "mkdir", after=1)
    with pytest.raises(KeyboardInterrupt), contextlib.ExitStack() as stack:
        temporary.made(stack, "dp-", str(tmp_path))
        pytest.fail("the signal is raised before the path is handed back")
    assert os.listdir(tmp_path) == []
