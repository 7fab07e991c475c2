"""An in-process Kubernetes API for the demo and the tests, that behaves as a real API server does
where our parts and kubectl depend on it (see `server` for the list), and holds a fleet.

`running_api()` starts it on 127.0.0.1 and writes a kubeconfig, so every component (and kubectl)
connects exactly as it would to a cluster (`--kubeconfig`), with no code path of its own for tests.
"""

from nodefabric_operator.demo.kubeapi.errors import ApiError
from nodefabric_operator.demo.kubeapi.running import RunningAPI, load_crds, running_api, write_kubeconfig
from nodefabric_operator.demo.kubeapi.selectors import SelectorError, parse_label_selector, selector_matches
from nodefabric_operator.demo.kubeapi.server import KubeAPI
from nodefabric_operator.demo.kubeapi.tables import as_table, jsonpath

__all__ = [
    "ApiError",
    "KubeAPI",
    "RunningAPI",
    "SelectorError",
    "as_table",
    "jsonpath",
    "load_crds",
    "parse_label_selector",
    "running_api",
    "selector_matches",
    "write_kubeconfig",
]
