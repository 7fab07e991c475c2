"""The node side's connection to the Kubernetes API: kubeconfig or in-cluster credentials, JSON requests,
watches, and what a failed request means. The agent (its Devices object) and the DRA driver (its
ResourceSlices, the ResourceClaims it prepares) both speak through it, in one process or apart.

Why not the `kubernetes` package: importing it costs about 36 MiB of resident memory (it loads every API
model class), more than half of the agent's 64 MiB budget on a node, for the dozen requests the node side
makes. This module speaks those requests over the standard library's `http.client`. The cluster side
(operator, extender) keeps the `kubernetes` package through `kubeclient.py`.

What it reads from a kubeconfig: the current context's cluster (`server`, `certificate-authority[-data]`,
`insecure-skip-tls-verify`, `tls-server-name`) and user (`token`, `tokenFile`, `client-certificate[-data]`
with `client-key[-data]`). Credential plugins (`exec`, `auth-provider`) are refused with one line at
start: the agent runs on its service account in a cluster, and a plugin is a program we would run on
every node. In a cluster it uses the service account's token (re-read when the kubelet rotates it) and CA.

Every call blocks; callers run it on a worker thread with a deadline, so a hung API server never holds
a pass, a kubelet call or a SIGTERM.

The package is cut along those seams, one module each: `errors` (what a failed request means), `backoff`,
`objects` (metadata, owner references, a Node's uid), `client` (`Api`: requests and watch streams over
HTTP), `watches` (`watch`, `ResumableWatch`) and `kubeconfig` (`load`: where the credentials come from).
Callers import the names from the package.
"""

from __future__ import annotations

from nodefabric_devicemanager.backoff import Backoff
from nodefabric_devicemanager.nodeclient.client import (
    MAX_BODY_BYTES,
    REQUEST_TIMEOUT_S,
    USER_AGENT,
    Api,
    Cancel,
    Credentials,
)
from nodefabric_devicemanager.nodeclient.errors import ApiError, ApiFailure, ConfigError, classify
from nodefabric_devicemanager.nodeclient.kubeconfig import (
    SERVICE_ACCOUNT_DIR,
    from_kubeconfig,
    in_cluster,
    load,
)
from nodefabric_devicemanager.nodeclient.objects import (
    metadata,
    node_uid,
    owner_reference,
    path_name,
    resource_version,
)
from nodefabric_devicemanager.nodeclient.watches import (
    WATCH_HEALTHY_AFTER_S,
    WATCH_SECONDS,
    ResumableWatch,
    sleep_or_stop,
    watch,
)

__all__ = [
    "MAX_BODY_BYTES",
    "REQUEST_TIMEOUT_S",
    "SERVICE_ACCOUNT_DIR",
    "USER_AGENT",
    "WATCH_HEALTHY_AFTER_S",
    "WATCH_SECONDS",
    "Api",
    "ApiError",
    "ApiFailure",
    "Backoff",
    "Cancel",
    "ConfigError",
    "Credentials",
    "ResumableWatch",
    "classify",
    "from_kubeconfig",
    "in_cluster",
    "load",
    "metadata",
    "node_uid",
    "owner_reference",
    "path_name",
    "resource_version",
    "sleep_or_stop",
    "watch",
]
