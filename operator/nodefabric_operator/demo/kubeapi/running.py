"""Starting the embedded API: on 127.0.0.1, with a kubeconfig every component and kubectl can use."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

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


def write_kubeconfig(url: str, directory: str) -> str:
    path = os.path.join(directory, "kubeconfig")
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "emulator", "user": {"token": "emulator"}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "emulator"}}],
        "current-context": "emulator",
    }
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    return path


@contextlib.asynccontextmanager
async def running_api(
    crds: Iterable[Mapping[str, Any]] = (),
    directory: str | None = None,
    *,
    port: int | None = None,
    **options: Any,
) -> AsyncIterator[RunningAPI]:
    """Serve a fresh API on 127.0.0.1 (`port`, or any free one) with the given CRDs applied and a
    kubeconfig pointing at it; `options` are KubeAPI's knobs (history, event_window, ...)."""
    with contextlib.ExitStack() as stack:
        if directory is None:
            directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="nodefabric-api-"))
        async with KubeAPI(**options) as api, kmock.Server(api, port=port) as server:
            for crd in crds:
                api.declare_crd(crd)
            url = str(server.url).rstrip("/")
            yield RunningAPI(api=api, server=server, url=url, kubeconfig=write_kubeconfig(url, directory))


def load_crds(paths: Iterable[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in paths:
        with open(path) as f:
            out.extend(doc for doc in yaml.safe_load_all(f) if doc)
    return out
