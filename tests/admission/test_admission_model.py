"""The PlacementGroup CRD: generated from the models (stale YAML fails), served by the embedded API with
its printer columns, and object names that are always valid and never collide."""

from __future__ import annotations

import asyncio
import json
import pathlib
import re
import urllib.request

import pytest

from nodefabric_operator.admission import model
from nodefabric_operator.demo.kubeapi import running_api

ROOT = pathlib.Path(__file__).resolve().parents[2]
SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@pytest.mark.parametrize(
    "path", [ROOT / "crds" / model.CRD_FILE, ROOT / "charts/nodefabric/crds" / model.CRD_FILE]
)
def test_committed_crd_is_current(path: pathlib.Path) -> None:
    assert path.read_text() == model.render(), f"{path} is stale: run `make crds`"


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("ml/job/train", "job-train"),
        ("ml/jobset/llm.v2", "jobset-llm.v2"),
    ],
)
def test_a_clean_key_names_its_object_plainly(key: str, expected: str) -> None:
    assert model.object_name(key) == expected


@pytest.mark.parametrize(
    "key",
    [
        "ml/explicit/Train_A",
        "ml/explicit/train-a",
        "ml/explicit/-x-",
        "ml/explicit/a..b",
        "ml/explicit/" + "x" * 300,
        "ml/explicit/" + "x" * 195 + "..." + "y" * 20,
        "ml/explicit/___",
        "ml/explicit/",
        "ml/leaderworkerset/ÄÖ-0",
    ],
)
def test_every_key_gives_a_valid_subdomain_and_changed_ones_carry_a_hash(key: str) -> None:
    name = model.object_name(key)
    assert SUBDOMAIN.fullmatch(name), name
    assert len(name) <= 253


def test_keys_that_clean_to_the_same_text_do_not_collide() -> None:
    a, b = model.object_name("ml/explicit/Train_A"), model.object_name("ml/explicit/train-a")
    assert a != b
    assert b == "explicit-train-a"
    assert a.startswith("explicit-train-a-") and len(a) == len("explicit-train-a-") + 10


def _call(req: urllib.request.Request) -> dict:
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


async def test_the_embedded_api_serves_it_with_its_printer_columns() -> None:
    pg = model.PlacementGroup(
        metadata={"name": "job-train", "namespace": "ml"},
        spec=model.PlacementGroupSpec(key="ml/job/train", family="job", name="train"),
    )
    async with running_api([model.placement_crd()]) as k:
        body = pg.model_dump(by_alias=True, mode="json", exclude={"status"})
        req = urllib.request.Request(
            f"{k.url}/apis/{model.API_VERSION}/namespaces/ml/{model.PLURAL}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        assert (await asyncio.to_thread(_call, req))["metadata"]["name"] == "job-train"
        req = urllib.request.Request(
            f"{k.url}/apis/{model.API_VERSION}/{model.PLURAL}",
            headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
        )
        table = await asyncio.to_thread(_call, req)
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names == ["Name", "Size", "Admitted", "Bound", "Level", "Location", "Phase", "Age"]
    assert table["rows"][0]["cells"][0] == "job-train"
