"""The extender's configuration file (YAML): locality levels and their label keys, defaults, domain."""

from __future__ import annotations

import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from nodefabric_devicemanager import vocabulary, yamldoc

Locality = str  # "prefer", "any", or the name of a configured level
Rank = Literal["spread", "first-fit", "most-free-memory"]
RANKS: tuple[str, ...] = ("spread", "first-fit", "most-free-memory")
# The label each accelerator resource's model is published under (NVIDIA GPU feature discovery, AMD's
# node labeller): a group asking for that resource keeps to one model. A group asking for none (kind,
# CPU-only jobs) needs no model label, so such clusters still place groups.
DEFAULT_HOMOGENEOUS_BY_RESOURCE: dict[str, tuple[str, ...]] = {
    "nvidia.com/gpu": ("nvidia.com/gpu.product",),
    "amd.com/gpu": ("amd.com/gpu.product-name",),
}


def _split(value: object) -> object:
    """A string "a, b" in a file or a flag is the list [a, b]."""
    return tuple(k.strip() for k in value.split(",") if k.strip()) if isinstance(value, str) else value


def canonical(value: str) -> str:
    """Policy names as the seed spells them (`network_group`, `first_fit`, `most_free_memory`) are
    aliases of the hyphenated ones; level names never hold an underscore, so the mapping is one to one."""
    return value.replace("_", "-")


class ConfigError(ValueError):
    """The configuration file cannot be used; the message says which field and why."""


class Level(BaseModel):
    """One locality level: nodes sharing the value of its first present key are one location."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z][a-z0-9-]*$")
    # Several keys name the same level on different providers; a node's value is the first one it carries.
    keys: tuple[str, ...] = Field(min_length=1)
    # How the decision summary names a location of this level ("zone europe-west1-b").
    title: str = ""

    @property
    def label(self) -> str:
        return self.title or self.name.replace("-", " ")


def default_levels(domain: str) -> tuple[Level, ...]:
    return (
        Level(
            name="fabric",
            title="fabric domain",
            keys=(vocabulary.fabric_domain_key(domain), "nvidia.com/gpu.clique"),
        ),
        Level(
            name="network-group",
            title="network group",
            keys=(
                vocabulary.network_group_key(domain),
                "network.topology.nvidia.com/leaf",
                "cloud.google.com/gce-topology-subblock",
                "topology.k8s.aws/network-node-layer-3",
            ),
        ),
        Level(name="zone", keys=("topology.kubernetes.io/zone",)),
        Level(name="region", keys=("topology.kubernetes.io/region",)),
    )


class ExtenderConfig(BaseModel):
    """Everything the placement decision reads besides the snapshot. All fields optional in the file."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    domain: str = vocabulary.DOMAIN
    # Tightest first; "any" is implicit and always last.
    levels: tuple[Level, ...] = ()
    default_locality: Locality = Field("prefer", alias="defaultLocality")
    default_rank: Rank = Field("spread", alias="defaultRank")
    # Label keys every group's nodes must share.
    homogeneous_keys: tuple[str, ...] = Field((), alias="homogeneousKeys")
    # Label keys a group's nodes must share when its pods ask for the resource.
    homogeneous_by_resource: dict[str, tuple[str, ...]] = Field(
        default_factory=lambda: dict(DEFAULT_HOMOGENEOUS_BY_RESOURCE), alias="homogeneousByResource"
    )
    # Resources whose use makes a node "loaded" for the spread rank.
    accelerator_resources: tuple[str, ...] = Field(
        ("nvidia.com/gpu", "amd.com/gpu", "huawei.com/Ascend910", "huawei.com/Ascend310"),
        alias="acceleratorResources",
    )
    # Per-accelerator memory in MiB as GPU feature discovery publishes it; feeds most-free-memory.
    accelerator_memory_label: str = Field("nvidia.com/gpu.memory", alias="acceleratorMemoryLabel")
    # A pod let through but not seen bound stops counting for its group after this long.
    claim_ttl_seconds: float = Field(300.0, gt=0, alias="claimTTLSeconds")
    # kube-scheduler reads FailedNodes only when no node is left (its "0/N nodes are available" and
    # preemption); with thousands of nodes, false saves encoding reasons it discards once a pod fits.
    # Summaries, Events and /debug/groups explain every decision either way.
    reasons_when_placed: bool = Field(True, alias="reasonsWhenPlaced")
    # Groups the extender keeps a record of (least recently used go first; what a group needs to go on
    # is persisted on its pods, so a dropped record is rebuilt from them).
    max_groups: int = Field(10_000, ge=1, le=1_000_000, alias="maxGroups")
    # Group admission (`nodefabric placement`): an admitted group not entirely bound and Ready this long
    # after its admission has its pods evicted and is admitted afresh.
    group_ready_timeout_seconds: float = Field(
        600.0, gt=0, le=7 * 24 * 3600, alias="groupReadyTimeoutSeconds"
    )

    @field_validator("default_locality", "default_rank", mode="before")
    @classmethod
    def _alias(cls, value: object) -> object:
        return canonical(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _fill_levels(self) -> ExtenderConfig:
        if not self.levels:
            object.__setattr__(self, "levels", default_levels(self.domain))
        names = [lv.name for lv in self.levels]
        if len(set(names)) != len(names):
            raise ValueError(f"level names must be unique, got {names}")
        if {"prefer", "any"} & set(names):
            raise ValueError("'prefer' and 'any' are policies, not level names")
        if self.default_locality not in self.localities:
            raise ValueError(
                f"defaultLocality {self.default_locality!r} is not one of {', '.join(self.localities)}"
            )
        return self

    @field_validator("homogeneous_by_resource", mode="before")
    @classmethod
    def _split_each(cls, value: object) -> object:
        return {k: _split(v) for k, v in value.items()} if isinstance(value, dict) else value

    @field_validator("homogeneous_keys", "accelerator_resources", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        return _split(value)

    @property
    def level_names(self) -> tuple[str, ...]:
        return tuple(lv.name for lv in self.levels)

    @property
    def localities(self) -> tuple[str, ...]:
        return ("prefer", *self.level_names, "any")

    @property
    def annotation_prefix(self) -> str:
        return vocabulary.placement_prefix(self.domain)

    def homogeneity_for(self, request: Mapping[str, int]) -> tuple[str, ...]:
        """The label keys a group's nodes must share by default, for pods asking for `request`."""
        keys = list(self.homogeneous_keys)
        for resource, more in self.homogeneous_by_resource.items():
            if resource in request:
                keys += [k for k in more if k not in keys]
        return tuple(keys)

    @property
    def indexed_homogeneity(self) -> tuple[tuple[str, ...], ...]:
        """Every key tuple `homogeneity_for` can return for a pod asking at most one accelerator kind:
        the cache keeps its indexes current for these."""
        out = [self.homogeneity_for({})]
        for resource in self.homogeneous_by_resource:
            keys = self.homogeneity_for({resource: 1})
            if keys not in out:
                out.append(keys)
        return tuple(out)


def regular_file(path: Path) -> Path:
    """The path, when it is a regular file (or a link to one, as a mounted ConfigMap's keys are).
    Opening a FIFO for reading blocks until a writer comes: start-up would hang instead of failing."""
    if not stat.S_ISREG(path.stat().st_mode):  # a missing file is the OSError stat() raises
        raise OSError(f"{path} is not a regular file")
    return path


def load_config(path: Path | None) -> ExtenderConfig:
    """Read the YAML file (camelCase or snake_case keys); no file gives the defaults."""
    if path is None:
        return ExtenderConfig()
    try:
        data = yamldoc.load(regular_file(path).read_text()) or {}
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read extender config {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"extender config {path} must be a mapping, got {type(data).__name__}")
    try:
        return ExtenderConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid extender config {path}: {exc}") from exc
