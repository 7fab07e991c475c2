"""The embedded API refuses what a real API server refuses, with the code, reason and causes it sends,
and a refused write changes nothing. Over real HTTP, as any client sends it."""

from __future__ import annotations

import copy
import json
from typing import Any

import aiohttp
import pytest

from nodefabric_devicemanager import crd
from nodefabric_operator.demo.kubeapi import ApiError, running_api

DEVICES_URL = "/apis/worker.gpustack.ai/v1alpha1/devices"
DEVICES = "worker.gpustack.ai/v1alpha1/devices"
WIDGETS_URL = "/apis/test.example.com/v1/namespaces/default/widgets"
MERGE = {"Content-Type": "application/merge-patch+json"}

# A CRD with every schema feature the API server enforces, to pin each refusal.
WIDGETS_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.test.example.com"},
    "spec": {
        "group": "test.example.com",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["size"],
                                "properties": {
                                    "size": {"type": "integer", "minimum": 1, "maximum": 8},
                                    "share": {"type": "number", "exclusiveMinimum": True, "minimum": 0},
                                    "big": {"type": "integer", "format": "int64"},
                                    "ratio": {"type": "number"},
                                    "code": {"type": "string", "maxLength": 5, "pattern": "^[a-z]+$"},
                                    "mode": {"type": "string", "enum": ["fast", "safe"], "default": "safe"},
                                    "port": {"x-kubernetes-int-or-string": True},
                                    "note": {"type": "string", "nullable": True},
                                    "since": {"type": "string", "format": "date-time"},
                                    "tags": {
                                        "type": "array",
                                        "maxItems": 2,
                                        "items": {"type": "string"},
                                        "x-kubernetes-list-type": "set",
                                    },
                                    "ports": {
                                        "type": "array",
                                        "items": {
                                            "type": "object",
                                            "required": ["name"],
                                            "properties": {
                                                "name": {"type": "string"},
                                                "protocol": {"type": "string", "default": "TCP"},
                                            },
                                        },
                                        "x-kubernetes-list-type": "map",
                                        "x-kubernetes-list-map-keys": ["name", "protocol"],
                                    },
                                    "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                                },
                            },
                            "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}},
                        },
                    }
                },
            }
        ],
    },
}


def widget(name: str = "w1", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "test.example.com/v1",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"size": 2, **spec},
    }


async def call(
    k: Any,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    *,
    raw: bytes | None = None,
) -> tuple[int, Any, aiohttp.ClientResponse]:
    async with aiohttp.ClientSession() as http:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        async with http.request(method, k.url + path, data=data, headers=hdrs) as resp:
            text = await resp.text()
            try:
                return resp.status, json.loads(text), resp
            except ValueError:
                return resp.status, text, resp


def causes(status: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(c["reason"], c["field"], c["message"]) for c in status["details"]["causes"]]


@pytest.fixture
async def k():
    async with running_api([crd.devices_crd(), WIDGETS_CRD]) as api:
        yield api


async def test_label_syntax_is_enforced_on_every_kind(k):
    bad_key = {"metadata": {"name": "n1", "labels": {"bad key": "x"}}}
    code, body, _ = await call(k, "POST", "/api/v1/nodes", bad_key)
    assert code == 422 and body["reason"] == "Invalid" and body["kind"] == "Status"
    assert body["details"] == {"name": "n1", "kind": "Node", "causes": body["details"]["causes"]}
    assert causes(body) == [
        (
            "FieldValueInvalid",
            "metadata.labels",
            "Invalid value: \"bad key\": name part must consist of alphanumeric characters, '-', '_' or "
            "'.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  "
            "or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
        )
    ]
    assert body["message"] == 'Node "n1" is invalid: metadata.labels: ' + causes(body)[0][2]

    long_value = "v" * 64
    feature = {"metadata": {"name": "n1", "labels": {"feature.gpustack.ai/x": long_value}}, "spec": {}}
    code, body, _ = await call(
        k, "POST", "/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/nfd/nodefeatures", feature
    )
    assert code == 422
    assert causes(body)[0][1:] == (
        "metadata.labels",
        f'Invalid value: "{long_value}": must be no more than 63 bytes',
    )

    prefix = {"metadata": {"name": "n1", "labels": {"Bad_Prefix/x": "1"}}, "spec": {}}
    code, body, _ = await call(k, "POST", DEVICES_URL, prefix)
    assert code == 422 and body["details"]["group"] == "worker.gpustack.ai"
    assert body["message"].startswith('Devices.worker.gpustack.ai "n1" is invalid: metadata.labels: ')
    assert "prefix part a lowercase RFC 1123 subdomain" in causes(body)[0][2]
    assert k.api.stored(DEVICES, "n1") is None and k.api.stored("v1/nodes", "n1") is None


async def test_a_refused_patch_changes_nothing_and_tells_no_watch(k):
    k.api.put_object("v1/nodes", {"metadata": {"name": "n1", "labels": {"a": "1"}}})
    before = k.api.stored("v1/nodes", "n1")
    rv = k.api.resource_version
    code, body, _ = await call(
        k, "PATCH", "/api/v1/nodes/n1", {"metadata": {"labels": {"a": "no way"}}}, MERGE
    )
    assert code == 422 and causes(body)[0][1] == "metadata.labels"
    assert k.api.stored("v1/nodes", "n1") == before
    assert k.api.resource_version == rv, "no resourceVersion was spent: no watch event exists"


async def test_names_and_metadata(k):
    code, body, _ = await call(k, "POST", "/api/v1/nodes", {"metadata": {"name": "Bad_Name"}})
    assert code == 422 and causes(body)[0][:2] == ("FieldValueInvalid", "metadata.name")
    assert "a lowercase RFC 1123 subdomain must consist of" in causes(body)[0][2]
    code, body, _ = await call(k, "POST", "/api/v1/nodes", {"metadata": {}})
    assert code == 422
    assert causes(body) == [
        ("FieldValueRequired", "metadata.name", "Required value: name or generateName is required")
    ]
    code, body, _ = await call(
        k, "POST", "/api/v1/namespaces/default/events", {"metadata": {"generateName": "pod."}}
    )
    assert code == 422 and causes(body)[0][1] == "metadata.generateName"
    code, body, _ = await call(
        k, "POST", "/api/v1/namespaces/default/events", {"metadata": {"generateName": "pod-"}}
    )
    assert code == 201 and body["metadata"]["name"].startswith("pod-") and len(body["metadata"]["name"]) == 9
    code, body, _ = await call(k, "POST", "/api/v1/namespaces", {"metadata": {"name": "a.b"}})
    assert code == 422 and "RFC 1123 label" in causes(body)[0][2]
    owner = {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": ""}
    code, body, _ = await call(
        k, "POST", "/api/v1/nodes", {"metadata": {"name": "n2", "ownerReferences": [owner]}}
    )
    assert code == 422
    assert causes(body) == [
        ("FieldValueInvalid", "metadata.ownerReferences.uid", 'Invalid value: "": uid must not be empty')
    ]
    code, body, _ = await call(k, "POST", "/api/v1/nodes", {"metadata": {"name": "n2", "labels": {"a": 1}}})
    assert code == 400 and body["reason"] == "BadRequest"
    assert (
        "cannot unmarshal number into Go struct field ObjectMeta.metadata.labels of type string"
        in body["message"]
    )
    code, body, _ = await call(
        k, "POST", "/api/v1/namespaces/default/pods", {"metadata": {"name": "p", "namespace": "other"}}
    )
    assert code == 400 and "does not match the namespace sent on the request" in body["message"]
    code, body, _ = await call(
        k, "POST", "/api/v1/nodes", {"apiVersion": "v2", "kind": "Node", "metadata": {"name": "x"}}
    )
    assert code == 400


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {"size": "two"},
            (
                "FieldValueTypeInvalid",
                "spec.size",
                'Invalid value: "string": spec.size in body must be of type integer: "string"',
            ),
        ),
        (
            {"size": 9},
            (
                "FieldValueInvalid",
                "spec.size",
                "Invalid value: 9: spec.size in body should be less than or equal to 8",
            ),
        ),
        (
            {"size": 0},
            (
                "FieldValueInvalid",
                "spec.size",
                "Invalid value: 0: spec.size in body should be greater than or equal to 1",
            ),
        ),
        (
            {"share": 0},
            (
                "FieldValueInvalid",
                "spec.share",
                "Invalid value: 0: spec.share in body should be greater than 0",
            ),
        ),
        (
            {"code": "abcdef"},
            ("FieldValueTooLong", "spec.code", "Too long: may not be more than 5 bytes"),
        ),
        (
            {"code": "ab1"},
            (
                "FieldValueInvalid",
                "spec.code",
                "Invalid value: \"ab1\": spec.code in body should match '^[a-z]+$'",
            ),
        ),
        (
            {"mode": "slow"},
            (
                "FieldValueNotSupported",
                "spec.mode",
                'Unsupported value: "slow": supported values: "fast", "safe"',
            ),
        ),
        (
            {"tags": ["a", "b", "c"]},
            ("FieldValueTooMany", "spec.tags", "Too many: 3: must have at most 2 items"),
        ),
        (
            {"tags": ["a", "a"]},
            ("FieldValueDuplicate", "spec.tags[1]", 'Duplicate value: "a"'),
        ),
        (
            {"ports": [{"name": "http"}, {"name": "http", "protocol": "TCP"}]},
            (
                "FieldValueDuplicate",
                "spec.ports[1]",
                'Duplicate value: map[string]interface {}{"name":"http", "protocol":"TCP"}',
            ),
        ),
        (
            {"ports": [{"protocol": "UDP"}]},
            ("FieldValueRequired", "spec.ports[0].name", "Required value"),
        ),
        (
            {"port": 1.5},
            (
                "FieldValueTypeInvalid",
                "spec.port",
                'Invalid value: "number": spec.port in body must be of type integer,string: "number"',
            ),
        ),
        (
            {"since": "yesterday"},
            (
                "FieldValueInvalid",
                "spec.since",
                'Invalid value: "yesterday": spec.since in body must be of type date-time: "yesterday"',
            ),
        ),
        (
            {"big": 2**63},
            (
                "FieldValueTypeInvalid",
                "spec.big",
                'Invalid value: "number": spec.big in body must be of type integer: "number"',
            ),
        ),
        (
            {"big": -(2**63) - 1},
            (
                "FieldValueTypeInvalid",
                "spec.big",
                'Invalid value: "number": spec.big in body must be of type integer: "number"',
            ),
        ),
    ],
)
async def test_the_crd_schema_refuses_with_kube_openapi_messages(k, spec, expected):
    code, body, _ = await call(k, "POST", WIDGETS_URL, widget(**spec))
    assert code == 422, body
    assert causes(body) == [expected]
    assert body["message"] == f'Widget.test.example.com "w1" is invalid: {expected[1]}: {expected[2]}'
    assert k.api.stored("test.example.com/v1/widgets", "w1", "default") is None


async def test_several_causes_are_listed_together(k):
    code, body, _ = await call(k, "POST", WIDGETS_URL, {**widget(), "spec": {"mode": "x", "code": "Q"}})
    assert code == 422
    assert sorted(c[1] for c in causes(body)) == ["spec.code", "spec.mode", "spec.size"]
    assert body["message"].startswith('Widget.test.example.com "w1" is invalid: [spec.size: Required value, ')


async def test_valid_values_at_the_edges_are_stored_with_defaults(k):
    spec = {"size": 8, "big": 2**63 - 1, "port": "http", "note": None, "since": "2026-01-02T03:04:05Z"}
    spec |= {"ports": [{"name": "http"}, {"name": "http", "protocol": "UDP"}], "ratio": 2**64}
    code, body, _ = await call(k, "POST", WIDGETS_URL, widget(**spec))
    assert code == 201, body
    stored = k.api.stored("test.example.com/v1/widgets", "w1", "default")["spec"]
    assert stored["big"] == 2**63 - 1 and stored["mode"] == "safe"
    assert stored["ports"] == [{"name": "http", "protocol": "TCP"}, {"name": "http", "protocol": "UDP"}]
    assert stored["note"] is None
    assert stored["ratio"] == float(2**64), "a number beyond int64 is read as a float, as the server reads it"


async def test_numbers_a_typed_object_cannot_hold_are_a_bad_request(k):
    code, body, _ = await call(k, "POST", "/api/v1/nodes", {"metadata": {"name": "n1"}, "spec": {"x": 2**64}})
    assert code == 400 and body["reason"] == "BadRequest" and "18446744073709551616" in body["message"]
    code, body, _ = await call(
        k, "POST", "/api/v1/nodes", raw=b'{"metadata": {"name": "n1"}, "spec": {"x": NaN}}'
    )
    assert code == 400
    code, body, _ = await call(k, "POST", "/api/v1/nodes", raw=b'{"metadata": {"name": "n1"}, "x": 1e999}')
    assert code == 400
    assert k.api.stored("v1/nodes", "n1") is None


async def test_unknown_fields_are_dropped_with_a_warning_or_refused_when_strict(k):
    code, body, resp = await call(k, "POST", WIDGETS_URL, widget(colour="red", extra={"anything": [1]}))
    assert code == 201
    assert "colour" not in body["spec"] and body["spec"]["extra"] == {"anything": [1]}
    assert resp.headers.getall("Warning") == ['299 - "unknown field \\"spec.colour\\""']
    code, body, _ = await call(k, "POST", WIDGETS_URL + "?fieldValidation=Strict", widget("w2", colour="red"))
    assert code == 400 and body["message"] == 'strict decoding error: unknown field "spec.colour"'
    code, body, resp = await call(
        k, "POST", WIDGETS_URL + "?fieldValidation=Ignore", widget("w3", colour="red")
    )
    assert code == 201 and "Warning" not in resp.headers


async def test_bodies_a_server_cannot_decode(k):
    assert (await call(k, "POST", "/api/v1/nodes", raw=b"{not json"))[0] == 400
    assert (await call(k, "POST", "/api/v1/nodes", raw=b"\xff\xfe\x00"))[0] == 400
    assert (await call(k, "POST", "/api/v1/nodes", [1, 2]))[0] == 400
    assert (await call(k, "POST", "/api/v1/nodes", raw=b""))[0] == 400
    code, body, _ = await call(
        k, "POST", "/api/v1/nodes", {"metadata": {"name": "n1"}}, {"Content-Type": "text/plain"}
    )
    assert code == 415 and body["reason"] == "UnsupportedMediaType"
    huge = {"metadata": {"name": "n1", "annotations": {"a": "x" * (3 * 1024 * 1024)}}}
    code, body, _ = await call(k, "POST", "/api/v1/nodes", huge)
    assert code == 413 and body["reason"] == "RequestEntityTooLarge"
    big = {"metadata": {"name": "n1", "annotations": {"a": "x" * (257 * 1024)}}}
    code, body, _ = await call(k, "POST", "/api/v1/nodes", big)
    assert code == 422 and causes(body) == [
        ("FieldValueTooLong", "metadata.annotations", "Too long: may not be more than 262144 bytes")
    ]


async def test_patch_types(k):
    k.api.put_object(
        "v1/nodes",
        {
            "metadata": {"name": "n1", "labels": {"a": "1"}},
            "status": {
                "conditions": [{"type": "Ready", "status": "False"}, {"type": "Disk", "status": "False"}]
            },
        },
    )
    smp = {"Content-Type": "application/strategic-merge-patch+json"}
    code, body, _ = await call(
        k,
        "PATCH",
        "/api/v1/nodes/n1/status",
        {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        smp,
    )
    assert code == 200
    assert body["status"]["conditions"] == [
        {"type": "Ready", "status": "True"},
        {"type": "Disk", "status": "False"},
    ]
    jp = {"Content-Type": "application/json-patch+json"}
    ops = [
        {"op": "test", "path": "/metadata/labels/a", "value": "1"},
        {"op": "add", "path": "/metadata/labels/b", "value": "2"},
    ]
    code, body, _ = await call(k, "PATCH", "/api/v1/nodes/n1", ops, jp)
    assert code == 200 and body["metadata"]["labels"] == {"a": "1", "b": "2"}
    code, body, _ = await call(
        k,
        "PATCH",
        "/api/v1/nodes/n1",
        [ops[0], {"op": "test", "path": "/metadata/labels/a", "value": "9"}],
        jp,
    )
    assert code == 422
    code, body, _ = await call(k, "PATCH", "/api/v1/nodes/n1", {"metadata": {}}, jp)
    assert code == 400
    k.api.put_object(DEVICES, {"metadata": {"name": "n1"}, "spec": {}})
    code, body, _ = await call(k, "PATCH", DEVICES_URL + "/n1", {"spec": {}}, smp)
    assert code == 415, "custom resources take no strategic merge patch"
    code, body, _ = await call(
        k, "PATCH", DEVICES_URL + "/n1", {"spec": {}}, {"Content-Type": "application/apply-patch+yaml"}
    )
    assert code == 415


async def test_concurrency_and_existence(k):
    code, node, _ = await call(k, "POST", "/api/v1/nodes", {"metadata": {"name": "n1"}})
    assert code == 201
    code, body, _ = await call(k, "POST", "/api/v1/nodes", {"metadata": {"name": "n1"}})
    assert (code, body["reason"], body["message"]) == (409, "AlreadyExists", 'nodes "n1" already exists')
    stale = {"metadata": {"resourceVersion": "1", "labels": {"x": "y"}}}
    code, body, _ = await call(k, "PATCH", "/api/v1/nodes/n1", stale, MERGE)
    assert (code, body["reason"]) == (409, "Conflict")
    assert body["message"].startswith(
        'Operation cannot be fulfilled on nodes "n1": the object has been modified'
    )
    code, body, _ = await call(k, "GET", DEVICES_URL + "/nope")
    assert (code, body["message"], body["details"]) == (
        404,
        'devices.worker.gpustack.ai "nope" not found',
        {"name": "nope", "group": "worker.gpustack.ai", "kind": "devices"},
    )
    code, body, _ = await call(k, "GET", "/apis/nowhere.example/v1/things")
    assert (code, body["message"]) == (404, "the server could not find the requested resource")
    replaced = {**node, "metadata": {**node["metadata"], "labels": {"r": "1"}}}
    code, body, _ = await call(k, "PUT", "/api/v1/nodes/n1", replaced)
    assert code == 200 and body["metadata"]["labels"] == {"r": "1"}
    code, body, _ = await call(k, "PUT", "/api/v1/nodes/n1", replaced)
    assert code == 409, "the resourceVersion it named is gone"


async def test_no_op_writes_and_generation(k):
    async def patch(path: str, body: dict[str, Any]) -> dict[str, Any]:
        code, obj, _ = await call(k, "PATCH", WIDGETS_URL + path, body, MERGE)
        assert code == 200, obj
        return obj

    _, obj, _ = await call(k, "POST", WIDGETS_URL, widget())
    rv, gen = obj["metadata"]["resourceVersion"], obj["metadata"]["generation"]
    obj = await patch("/w1", {"spec": {"size": 2}})
    assert (obj["metadata"]["resourceVersion"], obj["metadata"]["generation"]) == (rv, gen), "nothing changed"
    obj = await patch("/w1", {"metadata": {"labels": {"a": "b"}}})
    assert obj["metadata"]["resourceVersion"] != rv and obj["metadata"]["generation"] == gen
    obj = await patch("/w1/status", {"status": {"ready": True}, "spec": {"size": 5}})
    assert obj["status"] == {"ready": True} and obj["spec"]["size"] == 2, "a status write touches only status"
    assert obj["metadata"]["generation"] == gen
    obj = await patch("/w1", {"spec": {"size": 3}, "status": {"ready": False}})
    assert obj["metadata"]["generation"] == gen + 1 and obj["status"] == {"ready": True}


async def test_an_update_may_keep_what_an_older_schema_let_in(k):
    """Validation ratcheting (Kubernetes 1.30+): only what an update changes must be valid."""
    k.api.put_object(
        "test.example.com/v1/widgets",
        {**widget(size=99), "metadata": {"name": "w1", "namespace": "default"}},
        validate=False,
    )
    code, obj, _ = await call(k, "PATCH", WIDGETS_URL + "/w1/status", {"status": {"ready": True}}, MERGE)
    assert code == 200 and obj["spec"]["size"] == 99
    code, obj, _ = await call(k, "PATCH", WIDGETS_URL + "/w1", {"spec": {"mode": "fast"}}, MERGE)
    assert code == 200
    code, body, _ = await call(k, "PATCH", WIDGETS_URL + "/w1", {"spec": {"size": 98}}, MERGE)
    assert code == 422 and causes(body)[0][1] == "spec.size"


async def test_put_object_validates_as_a_write_does(k):
    with pytest.raises(ApiError) as err:
        k.api.put_object("v1/nodes", {"metadata": {"name": "n1", "labels": {"k": "bad value"}}})
    assert err.value.code == 422
    with pytest.raises(ApiError):
        k.api.put_object(
            "test.example.com/v1/widgets",
            {**widget(size=0), "metadata": {"name": "w", "namespace": "default"}},
        )


async def test_crds_are_checked_and_served_once_established(k):
    bad = {**WIDGETS_CRD, "metadata": {"name": "gadgets.test.example.com"}}
    code, body, _ = await call(k, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", bad)
    assert code == 422 and causes(body)[0][1] == "metadata.name"
    code, body, _ = await call(
        k, "GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.test.example.com"
    )
    assert {c["type"]: c["status"] for c in body["status"]["conditions"]} == {
        "NamesAccepted": "True",
        "Established": "True",
    }
    code, _, _ = await call(k, "POST", WIDGETS_URL, widget())
    assert code == 201
    code, _, _ = await call(
        k, "DELETE", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.test.example.com"
    )
    assert code == 200
    assert (await call(k, "GET", WIDGETS_URL))[0] == 404, "its resources are gone with it"


async def test_hostile_inputs_are_refused_not_crashed_on(k):
    """What a careless or hostile client sends: each gets the API server's answer, nothing is stored."""
    code, body, _ = await call(
        k, "POST", "/api/v1/nodes", {"metadata": {"name": "n1", "labels": {"a": "x\n"}}}
    )
    assert code == 422, "a trailing newline is not label syntax"
    code, body, _ = await call(k, "POST", "/api/v1/nodes", {"metadata": {"name": "n1\n"}})
    assert code == 422
    deep = b'{"metadata": {"name": "n1"}, "x": ' + b"[" * 5000 + b"1" + b"]" * 5000 + b"}"
    code, body, _ = await call(k, "POST", "/api/v1/nodes", raw=deep)
    assert code == 400 and body["reason"] == "BadRequest"
    code, body, _ = await call(k, "GET", "/api/v1/nodes?watch=true&timeoutSeconds=nan")
    assert code == 400
    code, body, _ = await call(k, "GET", "/api/v1/nodes?limit=ten")
    assert code == 400
    code, body, _ = await call(k, "GET", "/api/v1/nodes?watch=true&resourceVersion=abc")
    assert code == 400
    code, body, _ = await call(k, "POST", "/api/v1/nodes", None, raw=b"null")
    assert code == 400
    code, body, _ = await call(k, "DELETE", "/api/v1/nodes/nope")
    assert code == 404 and body["message"] == 'nodes "nope" not found'
    code, body, _ = await call(k, "HEAD", "/api/v1/nodes")
    assert code == 405
    assert [n for n in k.api.store.select("v1/nodes")] == []
    k.api.put_object("v1/nodes", {"metadata": {"name": "n1"}})
    code, body, _ = await call(
        k,
        "PATCH",
        "/api/v1/nodes/n1",
        {"metadata": {"labels": {"a": "b"}}},
        {"content-type": "application/merge-patch+json"},
    )
    assert code == 200, "header names are case-insensitive"
    with pytest.raises(ApiError):
        k.api.put_object("v1/nodes", {"metadata": {}}, validate=False)


def _broken_crd(path: list[Any], value: Any) -> dict[str, Any]:
    body = copy.deepcopy(WIDGETS_CRD)
    target = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return body


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (["spec", "versions"], "v1", "spec.versions"),
        (["spec", "names"], "widgets", "spec.names"),
        (["spec", "scope"], "Galaxy", "spec.scope"),
        (
            ["spec", "versions", 0, "schema", "openAPIV3Schema"],
            ["x"],
            "spec.versions[0].schema.openAPIV3Schema",
        ),
        (
            ["spec", "versions", 0, "additionalPrinterColumns"],
            [{"name": "X"}],
            "spec.versions[0].additionalPrinterColumns[0].jsonPath",
        ),
        (["spec", "versions", 0, "storage"], False, "spec.versions"),
        (
            ["spec", "versions", 0, "schema"],
            {"openAPIV3Schema": {"type": "whole"}},
            "spec.versions[0].schema.openAPIV3Schema",
        ),
        (
            ["spec", "versions", 0, "schema"],
            {"openAPIV3Schema": {"properties": {"a": {"pattern": "[x"}}}},
            "spec.versions[0].schema.openAPIV3Schema",
        ),
    ],
)
async def test_a_broken_crd_is_refused_before_anything_serves_it(k, path, value, field):
    body = _broken_crd(path, value)
    body["metadata"]["name"] = "widgets.test.example.com"
    k.api.remove_object("apiextensions.k8s.io/v1/customresourcedefinitions", "widgets.test.example.com")
    code, status, _ = await call(k, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body)
    assert code == 422, status
    assert field in [c[1] for c in causes(status)]
    assert (await call(k, "GET", WIDGETS_URL))[0] == 404
