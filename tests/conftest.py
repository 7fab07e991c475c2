"""Fixtures every test directory shares: `nodefabric` run in this process.

A `nodefabric` subprocess pays 2-4 s of imports on a loaded machine before it parses its first flag. Most
command tests check what the command prints and its exit status for some arguments, which the console's
own `main(argv)` gives in milliseconds once its modules are imported; each command keeps one test that runs
the real console script as a process (its smoke test), so the entry point and the process shell stay
covered.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from typing import Protocol

import pytest

from nodefabric_operator.console import main


class Console(Protocol):
    def __call__(
        self,
        *args: str,
        stdin: str | None = None,
        env: Mapping[str, str] | None = None,
        unset: Iterable[str] = (),
    ) -> subprocess.CompletedProcess[str]: ...


@pytest.fixture
def console(monkeypatch: pytest.MonkeyPatch) -> Console:
    """`nodefabric ARGS...` in this process: its exit status, stdout and stderr as a subprocess.run() with
    capture_output=True would give them. `env` is set and `unset` removed for the call only; stdin is
    `stdin` (empty when None). The environment and the logging set-up are restored afterwards. An
    exception escaping main() fails the test, as the traceback on stderr of a real process would."""

    def run(
        *args: str,
        stdin: str | None = None,
        env: Mapping[str, str] | None = None,
        unset: Iterable[str] = (),
    ) -> subprocess.CompletedProcess[str]:
        out, err = io.StringIO(), io.StringIO()
        # A TextIOWrapper, not a StringIO: commands that read `-f -` may read sys.stdin.buffer.
        feed = io.TextIOWrapper(io.BytesIO((stdin or "").encode()), encoding="utf-8")
        root = logging.getLogger()
        handlers, level = root.handlers[:], root.level  # main() configures logging for the process
        with monkeypatch.context() as m, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            for name in unset:
                m.delenv(name, raising=False)
            for name, value in (env or {}).items():
                m.setenv(name, value)
            m.setattr(sys, "stdin", feed)
            environ = dict(os.environ)  # a command may set variables for its own process (KUBECONFIG)
            try:
                code = main(list(args))
            except SystemExit as exc:
                code = _exit_status(exc, err)
            finally:
                os.environ.clear()
                os.environ.update(environ)
                root.handlers[:] = handlers
                root.setLevel(level)
        return subprocess.CompletedProcess(["nodefabric", *args], code, out.getvalue(), err.getvalue())

    return run


def _exit_status(exc: SystemExit, err: io.StringIO) -> int:
    """The status a process ending with this SystemExit would have (a message is printed and means 1)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    err.write(f"{exc.code}\n")
    return 1
