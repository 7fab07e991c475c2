"""The connection limits of every aiohttp listener the cluster side runs (the operator's probes and
metrics, the extender's two listeners): one place, so a slow-client fix is never made three times.

aiohttp arms a connection's keep-alive timer when the connection opens and re-arms it only after a
response, never as bytes arrive: a client that connects and says nothing, or trickles its request headers
a byte at a time, is closed when the timer fires, wherever it is in its headers. aiohttp's default is an
hour (3,630 s), so each such client held a socket and a file descriptor that long; `idle_timeout` is that
timer. A request body the handler did not read is drained for at most LINGER_S before the close.
"""

from __future__ import annotations

from aiohttp import web

# After refusing (or not reading) a body, aiohttp would read and discard the rest of it for 10 s.
LINGER_S = 1.0


def runner(app: web.Application, *, idle_timeout: float) -> web.AppRunner:
    """The runner of one listener: no access log (the components log what matters), no signal handling
    (the command owns its signals), and the limits above."""
    if not idle_timeout > 0:
        raise ValueError(f"idle_timeout must be positive, got {idle_timeout!r}")
    return web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        keepalive_timeout=idle_timeout,
        lingering_time=LINGER_S,
    )
