"""The topology hierarchy's levels: the extender's `Level` configuration, with the switch tiers added.

The fabric level is the extender's (the operator's fabric-domain label first, both spelt by `vocabulary`) and
the leaf tier takes every key the extender's network-group level accepts, so the two components read a
node the same way. Users rename
and reorder levels with the same YAML shape as the extender's `levels:` (name, keys, title).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import TypeAdapter, ValidationError

from nodefabric_devicemanager import vocabulary
from nodefabric_operator import labels
from nodefabric_operator.extender.config import Level
from nodefabric_operator.extender.config import default_levels as extender_levels

HOSTNAME = "kubernetes.io/hostname"

# Topograph from v1.1 numbers the switch tiers from the node up; up to v1.0 it names them.
TOPOGRAPH_TIER = "fabric.topograph.run/tier-{}"
TOPOGRAPH_NAMED = "network.topology.nvidia.com/{}"


# A qualified label key (what Kueue's and KAI's `nodeLabel` and every labelMatch accept).
_KEY = re.compile(
    r"(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?",
    re.ASCII,
)


# Kueue's and KAI's `nodeLabel` take 316 characters at most, one fewer than the longest label key.
NODE_LABEL_MAX = 316


def key_problem(key: str) -> str | None:
    """Why `key` is not a label key the API server accepts (or one the Topologies cannot name), or None."""
    prefix, _, name = key.rpartition("/")
    if not _KEY.fullmatch(key) or len(name) > 63 or len(prefix) > 253:
        return "not a qualified label key (an optional DNS-subdomain prefix and '/', a name of 63 at most)"
    if len(key) > NODE_LABEL_MAX:
        return f"longer than {NODE_LABEL_MAX} characters, which Kueue's and KAI's Topology refuse"
    return None


class LevelsError(ValueError):
    """The configured levels cannot be used; the message says why."""


def default_levels(domain: str = vocabulary.DOMAIN) -> tuple[Level, ...]:
    """Tightest first: fabric domain, leaf, spine, core, zone, region."""
    ext = {lv.name: lv for lv in extender_levels(domain)}
    group = ext["network-group"]
    return (
        ext["fabric"],  # the operator's fabric-domain label first (vocabulary.fabric_domain_key)
        Level(
            name="leaf",
            title="leaf switch",
            keys=(*group.keys, TOPOGRAPH_TIER.format(0)),
        ),
        Level(
            name="spine",
            title="spine switch",
            keys=(
                TOPOGRAPH_NAMED.format("spine"),
                TOPOGRAPH_TIER.format(1),
                "cloud.google.com/gce-topology-block",
                "topology.k8s.aws/network-node-layer-2",
            ),
        ),
        Level(
            name="core",
            title="core switch",
            keys=(
                TOPOGRAPH_NAMED.format("core"),
                TOPOGRAPH_TIER.format(2),
                "topology.k8s.aws/network-node-layer-1",
            ),
        ),
        ext["zone"],
        ext["region"],
    )


_LEVELS = TypeAdapter(tuple[Level, ...])


def parse_levels(data: Any) -> tuple[Level, ...]:
    """Levels from configuration (a list of {name, keys, title}); refuses duplicates and the hostname key,
    which every projection adds itself as the lowest level."""
    try:
        levels = _LEVELS.validate_python(data)
    except ValidationError as exc:
        raise LevelsError(f"invalid topology levels: {exc}") from exc
    check(levels)
    return levels


_KEYS = TypeAdapter(dict[str, tuple[str, ...]])


def with_keys(levels: Sequence[Level], overrides: Any) -> tuple[Level, ...]:
    """`levels` with the keys of the named ones replaced ({level name: [keys]}; an empty list keeps the
    level's keys): how the chart hands the extender's per-level keys to the same levels here."""
    try:
        keys: Mapping[str, tuple[str, ...]] = _KEYS.validate_python(overrides)
    except ValidationError as exc:
        raise LevelsError(f"invalid level keys: {exc}") from exc
    names = {lv.name for lv in levels}
    unknown = sorted(set(keys) - names)
    if unknown:
        raise LevelsError(f"level keys for {unknown}: no such level (levels: {', '.join(sorted(names))})")
    out = tuple(lv.model_copy(update={"keys": keys[lv.name]}) if keys.get(lv.name) else lv for lv in levels)
    check(out)
    return out


def check(levels: Sequence[Level]) -> None:
    if not levels:
        raise LevelsError("at least one topology level is needed")
    names = [lv.name for lv in levels]
    for name in names:
        if not labels.is_dns_label(name):
            raise LevelsError(f"level name {name!r} must be a DNS label (HyperNode names and tier names)")
    if len(set(names)) != len(names):
        raise LevelsError(f"level names must be unique, got {names}")
    seen: dict[str, str] = {}
    for lv in levels:
        for k in lv.keys:
            problem = key_problem(k)
            if problem is not None:
                raise LevelsError(f"level {lv.name}: {k!r} is {problem}")
            if k == HOSTNAME:
                raise LevelsError(f"level {lv.name}: {HOSTNAME} is added by every projection, not a level")
            if k in seen:
                raise LevelsError(f"label key {k} is in levels {seen[k]} and {lv.name}")
            seen[k] = lv.name
