"""Reaching the Kubernetes API the way kubectl does, for every component."""

from __future__ import annotations

import base64
import binascii
import os
import stat
from urllib.parse import unquote, urlsplit

import yaml
from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

from nodefabric_devicemanager import yamldoc

# What the kubernetes library's kubeconfig loader lets escape on a file that is not a kubeconfig: it walks
# the parsed YAML assuming the documented shape, so a list where a map belongs, a number where a string
# belongs, bytes that are not UTF-8 or *-data fields that are not base64 surface as these, not as
# ConfigException. Caught around that one call only, so our own bugs are never mistaken for a bad file.
_MALFORMED = (yaml.YAMLError, ValueError, TypeError, AttributeError, KeyError, IndexError)


def load_client(kubeconfig: str | os.PathLike[str] | None = None) -> client.ApiClient:
    """An explicit kubeconfig, else in-cluster, else KUBECONFIG / ~/.kube/config.

    Every problem with the configuration (a missing, unreadable or malformed kubeconfig, an unusable
    in-cluster account) is a ConfigException with a one-line message naming the file, which the CLIs
    report as a start-up error."""
    cfg = client.Configuration()
    if kubeconfig:
        _load_kubeconfig(os.fspath(kubeconfig), cfg)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        except OSError as exc:
            raise ConfigException(f"in-cluster configuration: cannot read it: {exc}") from exc
    else:
        # Read at call time: the library's own default is KUBECONFIG as it was when it was imported.
        path = os.environ.get("KUBECONFIG") or os.path.join("~", ".kube", "config")
        try:
            _load_kubeconfig(path, cfg)
        except ConfigException as exc:
            raise ConfigException(
                f"no API to reach: not in a cluster and no usable kubeconfig ({exc}); pass --kubeconfig"
            ) from exc
    # Every caller retries with its own backoff (and jitter); urllib3's would multiply it silently.
    cfg.retries = 0
    basic = proxy_authorization(cfg.proxy)
    if basic and not any(k.lower() == "proxy-authorization" for k in cfg.proxy_headers or {}):
        # urllib3's ProxyManager (the kubernetes client's) sends only proxy_headers, never the proxy URL's
        # user:password, which aiohttp (the operator's writes on its loop) and kubectl do send: said once
        # here, so every client of the process authenticates to the proxy alike.
        cfg.proxy_headers = {**(cfg.proxy_headers or {}), "Proxy-Authorization": basic}
    return client.ApiClient(cfg)


def proxy_authorization(proxy: str | None) -> str | None:
    """The Proxy-Authorization (Basic) a proxy URL's user:password asks for, percent-decoded as aiohttp and
    Go decode it; None for a URL without one (or a SOCKS proxy: urllib3's SOCKS manager reads it itself)."""
    if not proxy or proxy.lower().startswith("socks"):
        return None
    try:
        parts = urlsplit(proxy)
    except ValueError:
        return None  # a URL the client refuses itself, by its own message
    if parts.username is None:
        return None
    pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    # UTF-8, as client-go (kubectl, reading the same kubeconfig) sends them: a proxy taking kubectl's
    # credentials takes the operator's (not latin-1 as aiohttp would: another byte for an "é").
    return "Basic " + base64.b64encode(pair.encode()).decode("ascii")


def _load_kubeconfig(path: str, cfg: client.Configuration) -> None:
    """Load one kubeconfig (or a KUBECONFIG list of them) into cfg; ConfigException on any problem."""
    for one in filter(None, path.split(os.pathsep)):
        _refuse_bombs(os.path.expanduser(one))
    try:
        config.load_kube_config(config_file=path, client_configuration=cfg)  # type: ignore[no-untyped-call]
    except ConfigException as exc:
        raise ConfigException(f"kubeconfig {path}: {_one_line(exc)}") from exc
    except OSError as exc:
        raise ConfigException(f"kubeconfig {path}: cannot read it: {_one_line(exc)}") from exc
    except _MALFORMED as exc:
        raise ConfigException(f"kubeconfig {path} is malformed: {_what(exc)}") from exc


def _refuse_bombs(path: str) -> None:
    """The check every YAML file we read gets (yamldoc), before the library reads the file: its loader
    formats each entry into a string, so an alias bomb (a billion values in 1 KB) hangs it, and a
    document nested thousands deep is a RecursionError. Any other problem the library reports. A pipe
    (`--kubeconfig <(...)`) can be read once only: the library reads it unchecked."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError):
        return
    try:
        yamldoc.load(text)
    except yaml.YAMLError:
        return
    except ValueError as exc:
        raise ConfigException(f"kubeconfig {path} is malformed: {exc}") from exc


def _what(exc: BaseException) -> str:
    if isinstance(exc, yaml.YAMLError):
        return f"not YAML ({_one_line(exc)})"
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text ({_one_line(exc)})"
    if isinstance(exc, binascii.Error):
        return f"a *-data field is not base64 ({_one_line(exc)})"
    return f"not the shape of a kubeconfig ({type(exc).__name__}: {_one_line(exc)})"


def _one_line(exc: BaseException) -> str:
    """YAML errors quote the offending line over several; a log line is one."""
    return " ".join(str(exc).split())
