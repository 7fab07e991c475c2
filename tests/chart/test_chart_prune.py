"""Uninstall: a post-delete hook Job (`nodefabric operator --prune`) takes back the operator's labels, on
by default, with exactly the rights its sink's prune needs; `prune.enabled=false` keeps them."""

from __future__ import annotations

from typing import Any

import pytest
from chart_support import NAMESPACE, Doc, of_kind, one, pod_spec
from test_chart_rbac import CLUSTER, grants_of
from test_chart_validate import validate_all

JOB = "nf-nodefabric-prune"
HOOK = {
    "helm.sh/hook": "post-delete",
    "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded",
}


def hooks(docs: list[Doc]) -> list[Doc]:
    return [d for d in docs if d["metadata"]["name"] == JOB]


@pytest.mark.parametrize(
    ("sink", "grants"),
    [
        ("nodefeature", {(NAMESPACE, "nfd.k8s-sigs.io", "nodefeatures", ""): {"list", "delete"}}),
        ("node", {(CLUSTER, "", "nodes", ""): {"get", "list", "patch"}}),
    ],
)
def test_the_hook_prunes_its_sink_with_exactly_the_rights_it_needs(render: Any, sink: str, grants) -> None:
    docs = render({"labelSink": sink})
    made = hooks(docs)
    kinds = sorted(d["kind"] for d in made)
    expected = ["ClusterRole", "ClusterRoleBinding"] if sink == "node" else ["Role", "RoleBinding"]
    assert kinds == sorted(["Job", "ServiceAccount", *expected])
    for d in made:
        annotations = d["metadata"]["annotations"]
        assert {k: annotations[k] for k in HOOK} == HOOK, d["kind"]
        # The account and its rights exist before the Job that uses them.
        assert annotations["helm.sh/hook-weight"] == ("0" if d["kind"] == "Job" else "-10")
    assert grants_of(docs, JOB) == (grants, set())
    job = one(docs, "Job", JOB)
    spec = pod_spec(job)
    assert spec["serviceAccountName"] == JOB and spec["restartPolicy"] == "Never"
    (container,) = spec["containers"]
    args = container["args"]
    assert args[args.index("operator") :] == [
        "operator", "--prune", "--sink", sink, "--namespace", NAMESPACE, "--domain", "gpustack.ai",
        "--prune-timeout", "120",
    ]  # fmt: skip
    assert job["spec"]["activeDeadlineSeconds"] == 180
    assert container["securityContext"]["runAsNonRoot"] is True
    validate_all(made)


def test_the_command_the_hook_runs_parses(render: Any) -> None:
    """The Job's arguments are the real command line of `nodefabric`: parsed, they ask for a prune."""
    from nodefabric_operator import console

    (container,) = pod_spec(one(render(), "Job", JOB))["containers"]
    parser, command = console.build_parser(container["args"])
    args = parser.parse_args(container["args"])
    assert command is not None and args.prune and args.prune_timeout == 120.0 and args.sink == "nodefeature"


def test_on_by_default_and_kept_with_a_value(render: Any, default_docs: list[Doc]) -> None:
    assert hooks(default_docs)
    assert not hooks(render({"prune": {"enabled": False}}))
    assert not hooks(render({"operator": {"enabled": False}}))  # nothing was published by this release


def test_the_timeout_reaches_the_command_and_bad_values_are_refused(render: Any) -> None:
    job = one(render({"prune": {"timeoutSeconds": 30}}), "Job", JOB)
    args = pod_spec(job)["containers"][0]["args"]
    assert args[args.index("--prune-timeout") + 1] == "30" and job["spec"]["activeDeadlineSeconds"] == 90
    for bad in (0, -5, "soon", 1e9):
        with pytest.raises(Exception, match="timeoutSeconds"):
            render({"prune": {"timeoutSeconds": bad}})


def test_no_other_document_is_a_post_delete_hook(default_docs: list[Doc]) -> None:
    others = [
        d["metadata"]["name"]
        for d in default_docs
        if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "post-delete"
        and d["metadata"]["name"] != JOB
    ]
    assert others == []
    assert of_kind(default_docs, "Job")
