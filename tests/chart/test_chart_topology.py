"""operator.topology: the operator's --topology arguments as the chart renders them, read back by the
operator's own parser, and the values the schema refuses."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from chart_support import Doc, of_kind, one, pod_spec, refusal

from nodefabric_devicemanager.shell.errors import StartupError
from nodefabric_operator import cli
from nodefabric_operator.topology import report
from nodefabric_operator.topology.shell import TopologyOptions

OPERATOR = "nf-nodefabric-operator"


def operator_options(docs: list[Doc]) -> TopologyOptions | None:
    args = pod_spec(one(docs, "Deployment", OPERATOR))["containers"][0]["args"]
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    ns = parser.parse_args([str(a) for a in args[args.index("operator") + 1 :]])
    return cli.topology_options(ns, "gpustack.ai")


def test_by_default_every_target_is_allowed_and_the_objects_are_owned_by_the_operators_role(
    default_docs: list[Doc],
) -> None:
    opts = operator_options(default_docs)
    assert opts is not None
    assert opts.targets == ("kueue", "kai", "volcano")
    assert opts.name == "nodefabric" and opts.debounce == 2.0
    assert [lv.name for lv in opts.levels] == ["fabric", "leaf", "spine", "core", "zone", "region"]
    # The owner is the ClusterRole the release creates (and uninstall deletes).
    assert opts.owner == OPERATOR
    assert OPERATOR in {r["metadata"]["name"] for r in of_kind(default_docs, "ClusterRole")}
    # The report's CRD ships in crds/.
    crd = one(default_docs, "CustomResourceDefinition", report.CRD_NAME)
    assert crd == report.crd()


def test_targets_levels_and_name_reach_the_operator(render: Any) -> None:
    levels = [
        {"name": "nvl", "keys": ["feature.gpustack.ai/fabric.domain"]},
        {"name": "zone", "keys": ["z/k"]},
    ]
    values = {"operator": {"topology": {"kai": {"enabled": False}, "name": "gpus", "levels": levels}}}
    opts = operator_options(render(values))
    assert opts is not None
    assert opts.targets == ("kueue", "volcano") and opts.name == "gpus"
    assert [(lv.name, lv.keys) for lv in opts.levels] == [
        ("nvl", ("feature.gpustack.ai/fabric.domain",)),
        ("zone", ("z/k",)),
    ]
    assert operator_options(render({"operator": {"topology": {"enabled": False}}})) is None


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"name": "Not_A_Name"}, "name"),
        ({"levels": [{"name": "a"}]}, "keys"),
        ({"levels": [{"name": "a", "keys": []}]}, "keys"),
        ({"levels": [{"name": "A", "keys": ["k"]}]}, "name"),
        ({"kueue": True}, "kueue"),
        ({"debounceSeconds": -1}, "debounceSeconds"),
        ({"extra": 1}, "extra"),
        ({"levels": [{"name": "a", "keys": ["not a key"]}]}, "/operator/topology/levels/0/keys/0"),
        (
            {"levels": [{"name": "a", "keys": ["k"]}, {"name": "a", "keys": ["j"]}]},
            "the level name a is used twice",
        ),
        ({"levels": [{"name": "a", "keys": ["kubernetes.io/hostname"]}]}, "level a: kubernetes.io/hostname"),
    ],
)
def test_bad_topology_values_are_refused(render: Any, values: dict[str, Any], fragment: str) -> None:
    assert fragment in refusal(render, {"operator": {"topology": values}})


def test_levels_the_operator_would_refuse_at_start_are_refused_at_render(render: Any) -> None:
    """A key in two levels passes the schema, and the operator refuses it at start (exit 2): rendered, the
    install would succeed and the operator crash-loop, so the chart refuses it, as the operator would."""
    levels = [{"name": "a", "keys": ["k"]}, {"name": "b", "keys": ["k"]}]
    assert "the label key k is in levels a and b" in refusal(
        render, {"operator": {"topology": {"levels": levels}}}
    )
    with pytest.raises(StartupError, match="is in levels a and b"):
        cli.topology_options(
            argparse.Namespace(
                topology=True,
                topology_targets="kueue",
                topology_levels='[{"name": "a", "keys": ["k"]}, {"name": "b", "keys": ["k"]}]',
                topology_level_keys=None,
                topology_name="nodefabric",
            ),
            "gpustack.ai",
        )


@pytest.mark.parametrize(
    ("levels", "said"),
    [
        (
            {"fabric": ["example.com/k"], "zone": ["example.com/k"]},
            "the label key example.com/k is in levels",
        ),
        # The region level keeps its default key, which the zone now names too.
        (
            {"zone": ["topology.kubernetes.io/region"]},
            "topology.kubernetes.io/region is in levels zone and region",
        ),
        ({"networkGroup": ["kubernetes.io/hostname"]}, "level network-group: kubernetes.io/hostname"),
    ],
)
def test_extender_level_keys_the_operator_would_refuse_are_refused_at_render(
    render: Any, levels: dict[str, Any], said: str
) -> None:
    """extender.levels are the operator's topology levels too (unless operator.topology.levels says
    otherwise): the same keys the operator refuses at start are refused here, defaults filled in."""
    assert said in refusal(render, {"extender": {"levels": levels}})
    own = {"operator": {"topology": {"levels": [{"name": "rack", "keys": ["example.com/rack"]}]}}}
    assert operator_options(render({"extender": {"levels": levels}, **own})) is not None


def test_the_extenders_level_keys_are_the_topologys_too(render: Any) -> None:
    values = {"extender": {"levels": {"networkGroup": ["example.com/rack"], "zone": ["example.com/zone"]}}}
    opts = operator_options(render(values))
    assert opts is not None
    keys = {lv.name: lv.keys for lv in opts.levels}
    assert keys["leaf"] == ("example.com/rack",) and keys["zone"] == ("example.com/zone",)
    assert keys["fabric"][0] == "feature.gpustack.ai/fabric.domain"  # not overridden: the default
    # Levels of its own replace the defaults whole; the extender's keys are then not applied.
    own = [{"name": "rack", "keys": ["example.com/rack"]}]
    opts = operator_options(render({**values, "operator": {"topology": {"levels": own}}}))
    assert opts is not None and [lv.name for lv in opts.levels] == ["rack"]


def test_a_key_of_the_operators_own_spine_or_core_is_refused_in_extender_levels(render: Any) -> None:
    """Those two levels are the operator's alone, with its defaults: an extender level given one of their
    keys (a GKE block as the network group) would put it in two levels."""
    from nodefabric_operator.topology.levels import default_levels

    own = [lv for lv in default_levels() if lv.name in ("spine", "core")]
    assert own
    for level in own:
        for key in level.keys:
            said = refusal(render, {"extender": {"levels": {"networkGroup": [key]}}})
            assert f"the label key {key} is in levels" in said and level.name in said, said


def test_an_extender_level_key_longer_than_a_topology_names_is_refused_at_install(render: Any) -> None:
    """A label key of 317 characters (the longest the API server takes) is one Kueue's and KAI's
    `nodeLabel` refuses, and the operator with it at start: extender.levels feed its topology levels."""
    key = "a" * 253 + "/" + "b" * 63
    assert len(key) == 317
    assert "/extender/levels/zone/0" in refusal(render, {"extender": {"levels": {"zone": [key]}}})
    assert operator_options(render({"extender": {"levels": {"zone": [key[1:]]}}})) is not None
