"""The metrics and probe flags, one spelling on every long-running command:

    --bind-address ADDR   where /metrics, /healthz and /readyz listen (--metrics-address: the same flag,
                          the extender's and placement's older spelling)
    --metrics-port PORT   /metrics (and the probes too, unless --health-port names another port)
    --health-port PORT    /healthz and /readyz

Each command keeps its own defaults (the chart passes what it wants). Where a port may be 0, 0 turns it
off; on the operator, whose ports were always off unless given, 0 is refused as before.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from nodefabric_devicemanager import flags

SAME = -1  # --health-port's default where the probes are served beside /metrics


@dataclass(frozen=True, slots=True)
class Listen:
    """Where the metrics and probe server listens; a port of None is off, equal ports share a listener."""

    host: str
    metrics_port: int | None
    health_port: int | None


def add_serving_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup | Any,
    *,
    address: str = "0.0.0.0",
    metrics_port: int | None = 0,
    health_port: int | None = SAME,
    zero_is_off: bool = True,
) -> None:
    """Add the three flags with this command's defaults: a port of 0 (or None) is off, and SAME serves
    the probes on the metrics port. With `zero_is_off` False a port must be 1-65535 when given."""
    port = flags.port if zero_is_off else flags.port_on
    off = "; 0: off" if zero_is_off else ""

    def default(value: int | None) -> str:
        if value == SAME:
            return "default: the metrics port"
        return f"default {value}" if value else ("default 0" if zero_is_off else "off unless given")

    parser.add_argument(
        "--bind-address",
        "--metrics-address",
        dest="bind_address",
        default=address,
        metavar="ADDR",
        help=f"address of /metrics, /healthz and /readyz (default {address}; 127.0.0.1 keeps them local)",
    )
    parser.add_argument(
        "--metrics-port",
        type=port,
        default=metrics_port,
        metavar="PORT",
        help=f"port of /metrics ({default(metrics_port)}{off})",
    )
    parser.add_argument(
        "--health-port",
        type=port,
        default=health_port,
        metavar="PORT",
        help=f"port of /healthz and /readyz ({default(health_port)}{off})",
    )


def listen(args: argparse.Namespace) -> Listen:
    """The parsed flags as a Listen. Raises ValueError for an empty address."""
    host = str(args.bind_address)
    if not host.strip():
        raise ValueError("--bind-address is empty: give an address (0.0.0.0 for every one)")
    metrics_port = args.metrics_port or None
    health_port = metrics_port if args.health_port == SAME else (args.health_port or None)
    return Listen(host, metrics_port, health_port)


__all__ = ["SAME", "Listen", "add_serving_arguments", "listen"]
