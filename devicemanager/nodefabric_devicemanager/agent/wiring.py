"""The node process's composition root: the agent's record feeds the device plugin and the DRA driver.

The one module below `nodefabric_deviceplugin` that imports it (the layers contract names it as its only
exception): the agent publishes the record, the kubelet-facing servers serve from it, and this is where
the two are wired together, once, for `nodefabric agent` and for the demo alike.

The servers' modules load gRPC, which `nodefabric agent --once` and the parser never need, so they are
imported inside the functions that build a server; their types are imported for the checker only.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nodefabric_devicemanager import nodeclient
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import DevicesSpec

if TYPE_CHECKING:
    from nodefabric_devicemanager.agent.core import Agent
    from nodefabric_deviceplugin.dra.config import DriverConfig
    from nodefabric_deviceplugin.dra.driver import DraDriver
    from nodefabric_deviceplugin.resources import PluginConfig
    from nodefabric_deviceplugin.server import DevicePluginManager

SERVE = ("deviceplugin", "dra", "both")
# How the in-process DRA driver's requests name themselves in the API server's audit log.
DRA_USER_AGENT = "nodefabric-agent-dra"

RecordSink = Callable[[DevicesSpec], object]
Subscribe = Callable[[RecordSink], None]


class ConfigError(ValueError):
    """A device-plugin or DRA-driver setting the node cannot serve with; the message is one line."""


# --- flags and the settings they give (no gRPC) ---------------------------------------------------


def add_plugin_arguments(group: argparse._ArgumentGroup) -> None:
    """The device plugin's flags, as `nodefabric deviceplugin` spells them."""
    from nodefabric_deviceplugin.startup import add_plugin_arguments as add

    add(group)


def add_driver_arguments(group: argparse._ArgumentGroup) -> None:
    """The DRA driver's path flags, prefixed "dra-" beside the device plugin's."""
    from nodefabric_deviceplugin.dra.flags import add_driver_arguments as add

    add(group, prefix="dra-")


def plugin_config(args: argparse.Namespace) -> PluginConfig | None:
    """The device plugin's settings, checked before anything starts (the shared count against kubelet's
    message limit, the domain); None when the plugin is off. Raises ConfigError."""
    if args.no_device_plugin or args.serve == "dra":
        return None
    from nodefabric_deviceplugin.startup import config_from_args

    try:
        return config_from_args(args)
    except ValueError as exc:  # the device plugin's StartupError is one
        raise ConfigError(str(exc)) from exc


def driver_config(args: argparse.Namespace) -> DriverConfig | None:
    """The DRA driver's settings, checked before anything starts (the domain, the paths, their
    directories); None when the driver is not served. Raises ConfigError."""
    if args.serve == "deviceplugin":
        return None
    if args.serve == "both" and args.no_device_plugin:
        raise ConfigError("--serve both and --no-device-plugin contradict each other (use --serve dra)")
    from nodefabric_deviceplugin.dra.flags import config_from

    try:
        # Beside the device plugin the driver offers the whole functions; the VFs are the device plugin's.
        return config_from(args, functions=("pf",)) if args.serve == "both" else config_from(args)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


@dataclass(frozen=True, slots=True)
class Serving:
    """What the node serves to kubelet, checked: the device plugin's and the DRA driver's settings (None
    for one not served) and the device plugin's socket directory."""

    plugin: PluginConfig | None = None
    dra: DriverConfig | None = None
    plugin_dir: str = ""


def serving(args: argparse.Namespace) -> Serving:
    """The parsed flags' `Serving`, every setting checked before anything starts. Raises ConfigError."""
    return Serving(plugin_config(args), driver_config(args), args.plugin_dir)


# --- the servers, fed by the record ---------------------------------------------------------------


def device_plugin(
    subscribe: Subscribe, host: HostRoot, config: PluginConfig, plugin_dir: str, *, vfs_only: bool = False
) -> DevicePluginManager:
    """A device plugin serving every record `subscribe` hands on. `vfs_only`: beside a DRA driver that
    offers the whole functions, it serves only the VFs, so no endpoint is offered twice."""
    from nodefabric_deviceplugin.dra.devices import device_plugin_share
    from nodefabric_deviceplugin.server import DevicePluginManager
    from nodefabric_deviceplugin.source import RecordSource

    source = RecordSource()
    if vfs_only:
        subscribe(lambda spec: source.update(device_plugin_share(spec) or spec))
    else:
        subscribe(source.update)
    return DevicePluginManager(source, host, config=config, plugin_dir=plugin_dir)


def dra_driver(subscribe: Subscribe, host: HostRoot, config: DriverConfig, api: nodeclient.Api) -> DraDriver:
    """A DRA driver serving every record `subscribe` hands on, talking to the API through `api`."""
    from nodefabric_deviceplugin.dra.driver import DraDriver
    from nodefabric_deviceplugin.dra.kube import DraApi
    from nodefabric_deviceplugin.source import RecordSource

    source = RecordSource()
    subscribe(source.update)
    return DraDriver(config, source, host, DraApi(api, config))


@dataclass(frozen=True, slots=True)
class NodeServers:
    """The kubelet-facing servers of one node process; None for one not served."""

    plugin: DevicePluginManager | None = None
    dra: DraDriver | None = None


def build(agent: Agent, serving: Serving) -> NodeServers:
    """The agent's servers: the device plugin (VFs only when the DRA driver serves beside it) and the DRA
    driver, each fed by every record the agent publishes or confirms."""
    plugin, dra = serving.plugin, serving.dra
    manager = (
        device_plugin(agent.subscribe, agent.host, plugin, serving.plugin_dir, vfs_only=dra is not None)
        if plugin is not None
        else None
    )
    driver = None
    if dra is not None:
        # Its own connection, with the agent's credentials: a prepare that kubelet waits on never queues
        # behind the agent's requests. Counted with them in the agent's API metrics.
        credentials = dataclasses.replace(agent.client.api.credentials, user_agent=DRA_USER_AGENT)
        api = nodeclient.Api(credentials)
        agent.metrics.count_api(api)
        driver = dra_driver(agent.subscribe, agent.host, dra, api)
    return NodeServers(manager, driver)


__all__ = [
    "SERVE",
    "ConfigError",
    "NodeServers",
    "Serving",
    "add_driver_arguments",
    "add_plugin_arguments",
    "build",
    "device_plugin",
    "dra_driver",
    "driver_config",
    "plugin_config",
    "serving",
]
