"""Group-locality kube-scheduler extender: places the pods of a distributed job on a close group of nodes.

In-process API (the demo and the benchmark use it): `build_app(config, snapshot)` gives the aiohttp
application over a static snapshot, and `group_summary(app, group_key)` the decision summary of a group.
"""

from __future__ import annotations

from nodefabric_operator.extender.config import ExtenderConfig, load_config
from nodefabric_operator.extender.server import build_app, group_summary

__all__ = ["ExtenderConfig", "build_app", "group_summary", "load_config"]
