"""Reaching the Kubernetes API the way kubectl does, for every component."""

from __future__ import annotations

import os

from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException


def load_client(kubeconfig: str | os.PathLike[str] | None = None) -> client.ApiClient:
    """An explicit kubeconfig, else in-cluster, else KUBECONFIG / ~/.kube/config."""
    cfg = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=os.fspath(kubeconfig), client_configuration=cfg)  # type: ignore[no-untyped-call]
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        try:
            config.load_kube_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        except (ConfigException, OSError) as exc:
            raise ConfigException(
                f"no API to reach: not in a cluster and no usable kubeconfig ({exc}); pass --kubeconfig"
            ) from exc
    # Every caller retries with its own backoff (and jitter); urllib3's would multiply it silently.
    cfg.retries = 0
    return client.ApiClient(cfg)
