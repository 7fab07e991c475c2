"""Starting the embedded API: on 127.0.0.1, with a kubeconfig every component and kubectl can use."""

from __future__ import annotations

import base64
import contextlib
import os
import ssl
import tempfile
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp.test_utils
import kmock
import yaml

from nodefabric_operator.demo.kubeapi.server import KubeAPI


@dataclass
class RunningAPI:
    api: KubeAPI
    server: Any
    url: str
    kubeconfig: str

    def requests(self, method: str | None = None, resource: str | None = None) -> list[Any]:
        """Recent requests (the API keeps the last `history`), by HTTP method and resource
        ("worker.gpustack.ai/v1alpha1/devices")."""
        return self.api.requests(method, resource)

    def count(self, method: str | None = None, resource: str | None = None, verb: str | None = None) -> int:
        """How many requests the API received, by HTTP method, resource and verb: the tests' request
        budget. Exact over the API's whole life, whatever the bounded history still holds."""
        return self.api.count(method, resource, verb)


def write_kubeconfig(url: str, directory: str, token: str = "emulator", ca: bytes | None = None) -> str:
    """A kubeconfig for `url` with `token` (and the CA to trust, for https), readable by its owner only
    (it holds the credential)."""
    path = os.path.join(directory, "kubeconfig")
    cluster: dict[str, Any] = {"server": url}
    if ca is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": cluster}],
        "users": [{"name": "emulator", "user": {"token": token}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "emulator"}}],
        "current-context": "emulator",
    }
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a file left by an earlier run keeps its mode under O_CREAT: start afresh
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(config, f)
    return path


@contextlib.asynccontextmanager
async def running_api(
    crds: Iterable[Mapping[str, Any]] = (),
    directory: str | None = None,
    *,
    port: int | None = None,
    tls: bool = False,
    **options: Any,
) -> AsyncIterator[RunningAPI]:
    """Serve a fresh API on 127.0.0.1 (`port`, or any free one) with the given CRDs applied and a
    kubeconfig pointing at it; `options` are KubeAPI's knobs (history, event_window, token, ...).
    `tls`: serve https with a self-signed certificate the kubeconfig trusts (kubectl sends a token
    only over TLS)."""
    with contextlib.ExitStack() as stack:
        if directory is None:
            directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="nodefabric-api-"))
        cert = None
        server_options: dict[str, Any] = {}
        if tls:
            from nodefabric_operator.demo.kubeapi.tls import self_signed  # cryptography: only for https

            cert = self_signed(directory)
            server_options["server_cls"] = _tls_server(cert.server_context())
        async with KubeAPI(**options) as api, kmock.Server(api, port=port, **server_options) as server:
            for crd in crds:
                api.declare_crd(crd)
            url = str(server.url).rstrip("/")
            kubeconfig = write_kubeconfig(
                url, directory, api.token or "emulator", None if cert is None else cert.pem
            )
            yield RunningAPI(api=api, server=server, url=url, kubeconfig=kubeconfig)


def _tls_server(context: ssl.SSLContext) -> type[aiohttp.test_utils.RawTestServer]:
    class TLSServer(aiohttp.test_utils.RawTestServer):
        async def start_server(self, loop: Any = None, **kwargs: Any) -> None:
            await super().start_server(loop=loop, ssl=context, **kwargs)

    return TLSServer


def load_crds(paths: Iterable[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in paths:
        with open(path) as f:
            out.extend(doc for doc in yaml.safe_load_all(f) if doc)
    return out
