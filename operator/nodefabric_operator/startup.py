"""What the operator checks before kopf starts, each failure phrased for the one log line it becomes:
the API server reached and serving the Devices CRD, and the sink objects listed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import kubernetes
import urllib3

from nodefabric_devicemanager import models
from nodefabric_devicemanager.shell.errors import StartupError, first_line
from nodefabric_operator import sinks
from nodefabric_operator.reconcile import Reconciler

if TYPE_CHECKING:
    from nodefabric_operator.topology.shell import Projector  # imported only with --topology (cli)

PROBE_TIMEOUT = 5.0  # one discovery request at start


def server(api: kubernetes.client.ApiClient) -> str:
    host = str(api.configuration.host)
    return urlsplit(host).netloc or host


def check_api(
    api: kubernetes.client.ApiClient, timeout: float, stopping: Callable[[], bool] = lambda: False
) -> bool:
    """Reach the API server and see the Devices CRD served, retrying transient failures until `timeout`:
    True once it answers, False when `stopping` says so first (SIGTERM while waiting for it). Raises
    StartupError with the reason an operator can act on."""
    custom = kubernetes.client.CustomObjectsApi(api)
    where = server(api)
    deadline = time.monotonic() + timeout
    while True:
        try:
            # The answer is not decoded: whether it comes is the question, not what it lists.
            left = deadline - time.monotonic()
            custom.get_api_resources(
                models.GROUP,
                models.VERSION,
                _request_timeout=max(0.5, min(PROBE_TIMEOUT, left)),  # a black hole costs the budget, no more
                _preload_content=False,
            )
            return True
        except kubernetes.client.ApiException as err:
            status = sinks.status_of(err)
            if status == 404:
                raise StartupError(
                    f"the API server at {where} does not serve {models.GROUP}/{models.VERSION}: "
                    "install the Devices CRD (the chart's crds/) first"
                ) from err
            if status in (401, 403):
                raise StartupError(
                    f"the API server at {where} refused our credentials (HTTP {status} {err.reason or ''})"
                ) from err
            reason = f"HTTP {status} {err.reason or ''}".strip()
        except (urllib3.exceptions.HTTPError, OSError) as err:
            reason = cause(err)
        if time.monotonic() >= deadline:
            raise StartupError(f"cannot reach the API server at {where} (for {timeout:g} s): {reason}")
        if stopping():
            return False
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def cause(err: BaseException) -> str:
    """The innermost reason of a connection failure ("Connection refused"), not urllib3's wrapping."""
    seen: set[int] = set()
    inner: BaseException | None = err
    while inner is not None and id(inner) not in seen:
        seen.add(id(inner))
        if isinstance(inner, OSError) and inner.strerror:
            return inner.strerror
        reason = getattr(inner, "reason", None)
        inner = reason if isinstance(reason, BaseException) else inner.__cause__ or inner.__context__
    return first_line(err)


async def prime(reconciler: Reconciler, sink: str, namespace: str) -> None:
    """The start-up listing; a refusal (RBAC, a missing NodeFeature API) is a start-up error."""
    where = "NodeFeatures in " + namespace if sink == "nodefeature" else "Nodes and Devices"
    try:
        await reconciler.prime()
    except sinks.SinkError as err:  # a page that is no list page (a proxy's, a garbled one): what came
        raise StartupError(f"cannot list {where}: {err}") from err
    except kubernetes.client.ApiException as err:
        reason = f"HTTP {err.status} {err.reason or ''}".strip()
        hint = (
            " (install NFD, or run with --sink node)" if err.status == 404 and sink == "nodefeature" else ""
        )
        raise StartupError(f"cannot list {where}: {reason}{hint}") from err
    except (urllib3.exceptions.HTTPError, OSError) as err:
        raise StartupError(f"cannot list the sink objects: {cause(err)}") from err


async def prime_topology(projector: Projector) -> None:
    """The Node listing the topology check starts from; a refusal (RBAC) is a start-up error."""
    try:
        await asyncio.to_thread(projector.prime)
    except sinks.SinkError as err:  # a page that is no list page: what came
        raise StartupError(f"--topology: cannot list Nodes: {err}") from err
    except kubernetes.client.ApiException as err:
        reason = f"HTTP {err.status} {err.reason or ''}".strip()
        raise StartupError(f"--topology: cannot list Nodes: {reason}") from err
    except (urllib3.exceptions.HTTPError, OSError) as err:
        raise StartupError(f"--topology: cannot list Nodes: {cause(err)}") from err
