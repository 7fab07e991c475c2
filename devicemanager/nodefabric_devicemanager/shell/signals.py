"""SIGTERM and SIGINT for every long-running command: the first one logs, sets the command's stop event,
and arms a last resort that ends the process STOP_GRACE_S seconds later, whatever a thread is stuck in
(a host read in the kernel, a gRPC call). kubelet waits terminationGracePeriodSeconds and then kills;
exiting on our own first keeps the pod's end ours and its last log line useful."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)

# After the first signal the command gets this long to stop cleanly; then the process exits regardless.
STOP_GRACE_S = 5.0
# The status of a process that did not stop in time (not 0: something was stuck).
EXIT_STUCK = 1
SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _force_exit_later(grace: float, fields: dict[str, Any]) -> threading.Timer:
    def force() -> None:
        log.error(
            "did not stop in time; exiting now",
            extra={**fields, "grace_s": grace, "threads": sorted(t.name for t in threading.enumerate())},
        )
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        sys.stderr.flush()
        os._exit(EXIT_STUCK)

    timer = threading.Timer(grace, force)
    timer.daemon = True
    timer.start()
    return timer


@contextlib.contextmanager
def stop_on_signals(
    stop: asyncio.Event,
    *,
    grace: float | None = STOP_GRACE_S,
    on_signal: Callable[[], None] | None = None,
    **fields: Any,
) -> Iterator[None]:
    """Inside: SIGTERM/SIGINT set `stop` (and call `on_signal`); the first arms the forced exit after
    `grace` seconds (None: none). `fields` go on the log lines. Call from the event loop's thread; off
    the main thread (a test running the command in a thread) no handler can be installed and `stop` is
    the only way out."""
    loop = asyncio.get_running_loop()
    armed: list[threading.Timer] = []

    def handle(sig: signal.Signals) -> None:
        if not armed and not stop.is_set():
            log.info("stopping on signal", extra={**fields, "signal": sig.name})
            if grace is not None:
                armed.append(_force_exit_later(grace, fields))
        if on_signal is not None:
            on_signal()
        stop.set()

    installed = []
    for sig in SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread
            loop.add_signal_handler(sig, handle, sig)
            installed.append(sig)
    try:
        yield
    finally:
        for sig in installed:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(sig)
                if armed:
                    # Stopping on a signal: the clean-up after this block (closing servers, joining
                    # threads) runs on, and a second signal must not end it by the default action; the
                    # armed timer bounds it. Without a timer the default action is the only way out.
                    signal.signal(sig, _already_stopping(fields))


def _already_stopping(fields: dict[str, Any]) -> Callable[[int, Any], None]:
    def handle(signum: int, _: Any) -> None:
        log.info("already stopping; signal ignored", extra={**fields, "signal": signal.Signals(signum).name})

    return handle


__all__ = ["STOP_GRACE_S", "stop_on_signals"]
