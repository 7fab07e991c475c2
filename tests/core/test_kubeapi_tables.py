"""Printer columns with JSONPath filters (`[?(@.type=="Admitted")].status`, as CRDs' condition columns
are written) render in the server-side Table kubectl prints, as a real API server renders them."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from nodefabric_operator.admission.model import placement_crd
from nodefabric_operator.demo.kubeapi import jsonpath, running_api

OBJ: dict[str, Any] = {
    "status": {
        "conditions": [
            {"type": "Admitted", "status": "True", "reason": "Fits"},
            {"type": "AllBound", "status": "False"},
        ],
        "members": [{"pod": "a", "node": "n1"}, {"pod": "b", "node": "n2"}],
    }
}


@pytest.mark.parametrize(
    ("path", "values"),
    [
        ('.status.conditions[?(@.type=="Admitted")].status', ["True"]),
        (".status.conditions[?(@.type=='AllBound')].status", ["False"]),
        ('.status.conditions[?(@.type!="Admitted")].type', ["AllBound"]),
        ('.status.conditions[?(@.type=="TimedOut")].status', []),
        (".status.members[*].node", ["n1", "n2"]),
        (".status.members[-1].pod", ["b"]),
        (".status.members[0].pod", ["a"]),
        ("status.members[5].pod", []),
        (".status.conditions[?(@.type=~x)].status", []),  # not in the subset: no value, never an error
        (".nothing.here", []),
    ],
)
def test_jsonpath_subset(path: str, values: list[Any]) -> None:
    assert jsonpath(OBJ, path) == values


async def test_condition_columns_render_in_the_table() -> None:
    async with running_api([placement_crd()]) as k:
        k.api.put_object("v1/namespaces", {"metadata": {"name": "ml"}})
        pg = {
            "apiVersion": "placement.gpustack.ai/v1alpha1",
            "kind": "PlacementGroup",
            "metadata": {"name": "explicit-train", "namespace": "ml"},
            "spec": {"key": "ml/explicit/train", "family": "explicit", "name": "train"},
            "status": {
                "size": 8,
                "phase": "Bound",
                "conditions": [
                    {
                        "type": "Admitted",
                        "status": "True",
                        "reason": "Fits",
                        "message": "",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    },
                    {
                        "type": "AllBound",
                        "status": "True",
                        "reason": "Ready",
                        "message": "",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    },
                ],
            },
        }
        k.api.put_object("placement.gpustack.ai/v1alpha1/placementgroups", pg)
        headers = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}
        async with (
            aiohttp.ClientSession() as http,
            http.get(k.url + "/apis/placement.gpustack.ai/v1alpha1/placementgroups", headers=headers) as resp,
        ):
            table = await resp.json()
    names = [c["name"] for c in table["columnDefinitions"]]
    row = dict(zip(names, table["rows"][0]["cells"], strict=True))
    assert (row["Size"], row["Admitted"], row["Bound"], row["Phase"]) == (8, "True", "True", "Bound")
