"""A hostile neighbour in a socket directory, for the tests: something deleting a socket on sight."""

from __future__ import annotations

import os
import threading


def delete_on_sight(path: str, times: int, done: threading.Event) -> threading.Thread:
    """A thread that deletes `path` the instant it appears, `times` times (or until `done`)."""

    def run() -> None:
        left = times
        while left and not done.is_set():
            try:
                os.unlink(path)
                left -= 1
            except FileNotFoundError:
                pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread
