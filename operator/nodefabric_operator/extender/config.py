"""The extender's configuration file (YAML): locality levels and their label keys, defaults, domain."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

Locality = str  # "prefer", "any", or the name of a configured level
Rank = Literal["spread", "first-fit", "most-free-memory"]
RANKS: tuple[str, ...] = ("spread", "first-fit", "most-free-memory")


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
            keys=(f"feature.{domain}/fabric.domain", "nvidia.com/gpu.clique"),
        ),
        Level(
            name="network-group",
            title="network group",
            keys=(
                f"topology.{domain}/network-group",
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

    domain: str = "gpustack.ai"
    # Tightest first; "any" is implicit and always last.
    levels: tuple[Level, ...] = ()
    default_locality: Locality = Field("prefer", alias="defaultLocality")
    default_rank: Rank = Field("spread", alias="defaultRank")
    homogeneous_keys: tuple[str, ...] = Field(("nvidia.com/gpu.product",), alias="homogeneousKeys")
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

    @field_validator("homogeneous_keys", "accelerator_resources", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        return tuple(k.strip() for k in value.split(",") if k.strip()) if isinstance(value, str) else value

    @property
    def level_names(self) -> tuple[str, ...]:
        return tuple(lv.name for lv in self.levels)

    @property
    def localities(self) -> tuple[str, ...]:
        return ("prefer", *self.level_names, "any")

    @property
    def annotation_prefix(self) -> str:
        return f"placement.{self.domain}/"


def load_config(path: Path | None) -> ExtenderConfig:
    """Read the YAML file (camelCase or snake_case keys); no file gives the defaults."""
    if path is None:
        return ExtenderConfig()
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read extender config {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"extender config {path} must be a mapping, got {type(data).__name__}")
    try:
        return ExtenderConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid extender config {path}: {exc}") from exc
