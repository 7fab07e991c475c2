"""The demo's temporary directory against a signal at the worst moment: while it is made, and while it is
removed. The signal is sent from inside the file operation itself (the process signals itself from a
wrapped os call), so it lands exactly there on every run rather than when a timer happens to fire."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nodefabric_operator.demo import main as demo_main


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


def _signal_on_call(monkeypatch: pytest.MonkeyPatch, name: str, after: int) -> list[int]:
    """os.<name> sends this process SIGTERM on its `after`-th call; the returned list counts calls."""
    real: Callable[..., Any] = getattr(os, name)
    calls: list[int] = []

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        calls.append(1)
        if len(calls) == after:
            os.kill(os.getpid(), signal.SIGTERM)  # handled at the next bytecode, still inside the removal
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
        demo_main.removed_whole(str(root))
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
        demo_main._temporary_workdir(stack)
        pytest.fail("the signal is raised before the path is handed back")
    assert os.listdir(tmp_path) == []


def test_uninterrupted_without_a_signal_changes_nothing(tmp_path, ctrl_c_handlers):
    with contextlib.ExitStack() as stack:
        workdir = Path(demo_main._temporary_workdir(stack))
        assert workdir.is_dir() and workdir.name.startswith("nodefabric-demo-")
        assert oct(workdir.stat().st_mode & 0o777) == oct(0o700), "only its owner reads the kubeconfig"
        _tree(workdir)
    assert not workdir.exists()
    assert signal.getsignal(signal.SIGTERM) is signal.default_int_handler
