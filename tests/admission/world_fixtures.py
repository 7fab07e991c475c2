"""What the admission tests share: real certificates (made by openssl), the webhook served over HTTPS,
and waiting for a condition."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiohttp import web

from nodefabric_operator.admission.webhook import WebhookConfig, build_webhook_app, ssl_context
from nodefabric_operator.extender.config import ExtenderConfig


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(d: Path, name: str = "ca") -> tuple[Path, Path]:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}",
             "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.crt"))  # fmt: skip
    return d / f"{name}.crt", d / f"{name}.key"


def make_server_cert(
    d: Path, ca: tuple[Path, Path], name: str = "server", cn: str = "webhook"
) -> tuple[Path, Path]:
    """A serving certificate for 127.0.0.1 and localhost, signed by `ca`; returns (cert, key)."""
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}",
             "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"))  # fmt: skip
    _openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
             "-CAcreateserial", "-days", "1", "-out", str(d / f"{name}.crt"),
             "-extfile", str(d / "san.cnf"))  # fmt: skip
    return d / f"{name}.crt", d / f"{name}.key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def serving_webhook(
    config: WebhookConfig | ExtenderConfig, cert: Path, key: Path, port: int | None = None
) -> AsyncIterator[str]:
    """The webhook on https://127.0.0.1:<port>; yields its base URL."""
    runner = web.AppRunner(build_webhook_app(config), access_log=None)
    await runner.setup()
    port = port or free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=ssl_context(cert, key)).start()
    try:
        yield f"https://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def until(predicate: Callable[[], bool], timeout: float = 15, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.05)
