"""One gRPC server on one unix socket in a directory kubelet manages, served again when its file goes.

The device plugin's three families and the DRA driver's two sockets are each one of these: kubelet deletes
the sockets in its directories when it restarts, and a socket deleted, replaced, or never there must be
served again, with a backoff when serving fails or cannot stand.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable

import grpc

from nodefabric_devicemanager.backoff import Backoff

log = logging.getLogger(__name__)

Identity = tuple[int, int, int]
MAX_BACKOFF_S = 5.0
# A socket gone sooner than this after it was served is not kubelet's routine cleanup (systemd restarts a
# crashed kubelet after seconds): something deletes it on sight, another plugin on the directory. Its
# serve counts as failed, so the retries back off instead of spinning.
QUICK_LOSS_S = 1.0


def identity(path: str) -> Identity | None:
    """Which file is at `path` now (inode numbers are reused on tmpfs, so the ctime is part of it)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class UnixServer:
    """A gRPC server on `path`; `add_services` adds the services to each fresh server."""

    def __init__(
        self, path: str, add_services: Callable[[grpc.aio.Server], None], what: str, *, grace: float | None
    ) -> None:
        self.path = path
        self.add_services = add_services
        self.what = what
        self.grace = grace  # for in-flight calls at stop: None cancels them
        self._server: grpc.aio.Server | None = None
        self._socket: Identity | None = None
        self.failures = 0
        self.retry_at = 0.0  # monotonic time of the next try after a failed serve
        self.error = ""  # why the last serve failed ("" once one stood)
        self.served_at: float | None = None  # when the socket now expected was served

    def needs_serving(self) -> bool:
        """Not serving yet, or our socket file was deleted or replaced."""
        return self._server is None or identity(self.path) != self._socket

    def due(self, now: float) -> bool:
        return self.needs_serving() and self.retry_at <= now

    async def serve_again(self, now: float, retry_base: float) -> bool:
        """Serve on a fresh socket; False, logged and backed off, when that failed or when the socket
        this replaces was lost as soon as it was served."""
        lost, self.served_at = self.served_at, None
        try:
            if lost is not None and now - lost < QUICK_LOSS_S:
                raise OSError(f"{self.path} was removed as soon as it was served")
            if lost is not None:
                self.failures = 0  # it stood: whatever removed it (a kubelet restart) is routine
            await self.serve()
        except (OSError, RuntimeError) as exc:  # grpc reports a failed bind as RuntimeError
            self.failures += 1
            backoff = Backoff(retry_base, MAX_BACKOFF_S, jitter=False).delay(self.failures)
            self.retry_at = now + backoff
            self.error = f"cannot serve on {self.path}: {exc}"
            log.error(
                "cannot serve; will retry",
                extra={
                    "what": self.what,
                    "socket": self.path,
                    "why": str(exc),
                    "retry_in_s": round(backoff, 2),
                },
            )
            return False
        self.retry_at, self.error, self.served_at = 0.0, "", now
        return True

    async def serve(self) -> None:
        """(Re)start serving on a fresh socket file."""
        await self.stop()
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # a stale socket from a previous run refuses the bind
        server = grpc.aio.server()
        self.add_services(server)
        server.add_insecure_port(f"unix://{self.path}")
        await server.start()
        socket = identity(self.path)
        if socket is None:
            # Deleted between bind and this look (kubelet restarting): "serving, no file" would equal
            # "no file" for ever, and the socket would never be registered again. Retry instead.
            await server.stop(grace=None)
            raise OSError(f"{self.path} was removed as soon as it was bound")
        self._server = server
        self._socket = socket
        log.info("serving", extra={"what": self.what, "socket": self.path})

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace=self.grace)
            # Only our own socket file: kubelet may already have put something else there.
            if identity(self.path) == self._socket:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
        self._socket = None
