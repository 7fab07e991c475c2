"""Credentials: an explicit kubeconfig, the service account in a cluster, or $KUBECONFIG /
~/.kube/config, in kubectl's order, and the kubeconfig fields the node side reads (see the package's
docstring)."""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from dataclasses import replace
from typing import Any

from nodefabric_devicemanager.nodeclient.client import USER_AGENT, Api, Credentials
from nodefabric_devicemanager.nodeclient.errors import ConfigError

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def load(kubeconfig: str | None = None, user_agent: str = USER_AGENT) -> Api:
    """An explicit kubeconfig, else in-cluster, else $KUBECONFIG / ~/.kube/config (kubectl's order).
    `user_agent` names the component in the API server's audit log and its priority-and-fairness rules."""
    if kubeconfig:
        credentials = from_kubeconfig([kubeconfig])
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        credentials = in_cluster()
    else:
        paths = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
        if not paths:
            default = os.path.expanduser("~/.kube/config")
            if not os.path.exists(default):
                raise ConfigError("no API to reach: not in a cluster and no kubeconfig; pass --kubeconfig")
            paths = [default]
        credentials = from_kubeconfig(paths)
    return Api(replace(credentials, user_agent=user_agent))


def in_cluster(directory: str = SERVICE_ACCOUNT_DIR) -> Credentials:
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    token_file = os.path.join(directory, "token")
    ca_file = os.path.join(directory, "ca.crt")
    if not host or not os.path.exists(token_file):
        raise ConfigError(f"in a cluster but without a service-account token at {token_file}")
    try:
        context = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the cluster CA {ca_file}: {exc}") from exc
    netloc = f"[{host}]" if ":" in host else host
    return Credentials(server=f"https://{netloc}:{port}", ssl_context=context, token_file=token_file)


def _merged(paths: list[str]) -> tuple[dict[str, Any], str]:
    """kubectl's merge of several kubeconfig files: the first file to set a value wins."""
    import yaml  # only a kubeconfig needs it; in a cluster it is never imported

    from nodefabric_devicemanager import yamldoc

    merged: dict[str, Any] = {"clusters": {}, "users": {}, "contexts": {}, "current-context": ""}
    base_dir = ""
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                doc = yamldoc.load(f.read())
        except FileNotFoundError as exc:
            if len(paths) == 1:
                raise ConfigError(f"kubeconfig {path} does not exist") from exc
            continue
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise ConfigError(f"kubeconfig {path} cannot be read: {str(exc).splitlines()[0]}") from exc
        if not isinstance(doc, dict):
            raise ConfigError(f"kubeconfig {path} is not a kubeconfig (not a mapping)")
        base_dir = base_dir or os.path.dirname(os.path.abspath(path))
        for kind, field in (("clusters", "cluster"), ("users", "user"), ("contexts", "context")):
            entries = doc.get(kind) or []
            if not isinstance(entries, list):
                raise ConfigError(f"kubeconfig {path}: {kind} is not a list")
            for entry in entries:
                if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                    merged[kind].setdefault(entry["name"], entry.get(field) or {})
        if not merged["current-context"] and isinstance(doc.get("current-context"), str):
            merged["current-context"] = doc["current-context"]
    return merged, base_dir


def _file_or_data(entry: dict[str, Any], key: str, base_dir: str) -> tuple[str | None, bytes | None]:
    path, data = entry.get(key), entry.get(f"{key}-data")
    if data:
        try:
            return None, base64.b64decode(str(data), validate=True)
        except ValueError as exc:
            raise ConfigError(f"kubeconfig {key}-data is not base64") from exc
    if path:
        return os.path.join(base_dir, str(path)), None
    return None, None


def _ssl_context(cluster: dict[str, Any], user: dict[str, Any], base_dir: str) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if cluster.get("insecure-skip-tls-verify"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    ca_file, ca_data = _file_or_data(cluster, "certificate-authority", base_dir)
    try:
        if ca_data is not None:
            context.load_verify_locations(cadata=ca_data.decode("ascii", errors="replace"))
        elif ca_file is not None:
            context.load_verify_locations(cafile=ca_file)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ConfigError(f"cannot load the kubeconfig's certificate authority: {exc}") from exc
    cert_file, cert_data = _file_or_data(user, "client-certificate", base_dir)
    key_file, key_data = _file_or_data(user, "client-key", base_dir)
    if (cert_file or cert_data) and (key_file or key_data):
        with tempfile.TemporaryDirectory(prefix="nf-kc-") as tmp:
            # ssl loads a certificate chain from files only; data stays in a private directory for a moment.
            if cert_data is not None:
                cert_file = os.path.join(tmp, "cert.pem")
                _write_private(cert_file, cert_data)
            if key_data is not None:
                key_file = os.path.join(tmp, "key.pem")
                _write_private(key_file, key_data)
            assert cert_file is not None and key_file is not None
            try:
                context.load_cert_chain(cert_file, key_file)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"cannot load the kubeconfig's client certificate: {exc}") from exc
    return context


def _write_private(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def from_kubeconfig(paths: list[str]) -> Credentials:
    merged, base_dir = _merged(paths)
    name = merged["current-context"]
    context = merged["contexts"].get(name)
    if not name or not isinstance(context, dict):
        raise ConfigError(f"kubeconfig {', '.join(paths)} has no current context")
    cluster = merged["clusters"].get(context.get("cluster"))
    user = merged["users"].get(context.get("user"), {})
    if not isinstance(cluster, dict) or not cluster.get("server"):
        raise ConfigError(f"kubeconfig context {name!r} names no cluster with a server")
    if not isinstance(user, dict):
        raise ConfigError(f"kubeconfig context {name!r}: its user is not a mapping")
    for plugin in ("exec", "auth-provider"):
        if user.get(plugin):
            raise ConfigError(
                f"kubeconfig user {context.get('user')!r} needs the {plugin!r} credential plugin, which the "
                "agent does not run; give it a token, a tokenFile or a client certificate"
            )
    server = str(cluster["server"])
    token_file = user.get("tokenFile")
    return Credentials(
        server=server,
        ssl_context=_ssl_context(cluster, user, base_dir) if server.startswith("https:") else None,
        tls_server_name=cluster.get("tls-server-name") or None,
        token=str(user["token"]) if user.get("token") else None,
        token_file=os.path.join(base_dir, str(token_file)) if token_file else None,
    )
