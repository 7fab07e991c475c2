"""The embedded API refuses the names a real API server refuses in built-in kinds' specs (the rules of
nodefabric_operator.demo.kubeapi.naming, which the chart tests apply to every render too): 422 Invalid,
one cause per field with its path, nothing stored. Over real HTTP."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from nodefabric_operator.demo.kubeapi import running_api

C0 = "spec.containers[0]."
PODS = "/api/v1/namespaces/default/pods"
TOO_LONG = 'Invalid value: "extender-metrics": must be no more than 15 bytes'


async def post(k: Any, path: str, body: Any) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(k.url + path, data=json.dumps(body), headers={"Content-Type": "application/json"}) as resp,
    ):
        return resp.status, await resp.json()


def causes(status: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(c["reason"], c["field"], c["message"]) for c in status["details"]["causes"]]


def pod(pod_name: str = "p1", **container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name},
        "spec": {"containers": [{"name": "c", "image": "x", **container}]},
    }


@pytest.fixture
async def k():
    async with running_api() as api:
        api.api.declare("v1/services", kind="Service", namespaced=True)
        api.api.declare("apps/v1/deployments", kind="Deployment", namespaced=True)
        yield api


async def test_a_pod_with_a_16_character_port_name_is_refused_with_each_field(k) -> None:
    probe = {"httpGet": {"path": "/healthz", "port": "extender-metrics"}}
    body = pod(ports=[{"name": "extender-metrics", "containerPort": 9102}], livenessProbe=probe)
    code, status = await post(k, PODS, body)
    assert code == 422 and status["reason"] == "Invalid"
    assert causes(status) == [
        ("FieldValueInvalid", C0 + "ports[0].name", TOO_LONG),
        ("FieldValueInvalid", C0 + "livenessProbe.httpGet.port", TOO_LONG),
    ]
    assert status["message"].startswith('Pod "p1" is invalid: [spec.containers[0].ports[0].name: ')
    assert k.api.stored("v1/pods", "p1", "default") is None

    body = pod(ports=[{"name": "ext-metrics", "containerPort": 9102}], livenessProbe=probe | {})
    body["spec"]["containers"][0]["livenessProbe"] = {"httpGet": {"path": "/", "port": "ext-metrics"}}
    code, status = await post(k, PODS, body)
    assert code == 201, status


@pytest.mark.parametrize(
    ("container", "field", "says"),
    [
        ({"env": [{"name": "1BAD", "value": "x"}]}, C0 + "env[0].name", "must not start with a digit"),
        ({"env": [{"name": "", "value": "x"}]}, C0 + "env[0].name", "Required value"),
        (
            {"envFrom": [{"prefix": "A=", "configMapRef": {"name": "c"}}]},
            C0 + "envFrom[0].prefix",
            "environment variable",
        ),
        ({"ports": [{"name": "9102", "containerPort": 1}]}, C0 + "ports[0].name", "at least one letter"),
        (
            {"ports": [{"name": "m", "containerPort": 70000}]},
            C0 + "ports[0].containerPort",
            "between 1 and 65535",
        ),
        (
            {"readinessProbe": {"tcpSocket": {"port": 0}}},
            C0 + "readinessProbe.tcpSocket.port",
            "between 1 and 65535",
        ),
        ({"name": "Bad_Name"}, C0 + "name", "RFC 1123 label"),
        (
            {"volumeMounts": [{"name": "nope", "mountPath": "/x"}]},
            C0 + "volumeMounts[0].name",
            'Not found: "nope"',
        ),
    ],
)
async def test_pod_spec_names(k, container: dict[str, Any], field: str, says: str) -> None:
    code, status = await post(k, PODS, pod(**container))
    assert code == 422, status
    assert [c[1] for c in causes(status)] == [field] and says in causes(status)[0][2]


async def test_duplicate_names_in_a_pod(k) -> None:
    body = pod(ports=[{"name": "m", "containerPort": 1}, {"name": "m", "containerPort": 2}])
    body["spec"]["containers"].append({"name": "c", "image": "y"})
    code, status = await post(k, PODS, body)
    assert code == 422
    assert causes(status) == [
        ("FieldValueDuplicate", C0 + "ports[1].name", 'Duplicate value: "m"'),
        ("FieldValueDuplicate", "spec.containers[1].name", 'Duplicate value: "c"'),
    ]


async def test_a_service_name_is_a_dns_1035_label_and_its_target_port_a_port_name(k) -> None:
    svc = {
        "metadata": {"name": "1-metrics"},
        "spec": {"selector": {"app": "x"}, "ports": [{"port": 9102, "targetPort": "extender-metrics"}]},
    }
    code, status = await post(k, "/api/v1/namespaces/default/services", svc)
    assert code == 422
    fields = [c[1] for c in causes(status)]
    assert fields == ["metadata.name", "spec.ports[0].targetPort"]
    assert "DNS-1035 label" in causes(status)[0][2] and causes(status)[1][2] == TOO_LONG
    svc["metadata"]["name"] = "metrics"
    svc["spec"]["ports"] = [{"port": 9102, "targetPort": 9102}, {"port": 1, "name": "Web"}]
    code, status = await post(k, "/api/v1/namespaces/default/services", svc)
    assert code == 422
    assert [c[:2] for c in causes(status)] == [
        ("FieldValueRequired", "spec.ports[0].name"),
        ("FieldValueInvalid", "spec.ports[1].name"),
    ]


async def test_a_deployment_selector_must_select_its_template(k) -> None:
    deployment = {
        "metadata": {"name": "d"},
        "spec": {
            "selector": {"matchLabels": {"app": "x"}},
            "template": {
                "metadata": {"labels": {"app": "y"}, "annotations": {"bad key": "1"}},
                "spec": {"containers": [{"name": "c", "image": "i"}]},
            },
        },
    }
    code, status = await post(k, "/apis/apps/v1/namespaces/default/deployments", deployment)
    assert code == 422
    assert [c[1] for c in causes(status)] == [
        "spec.template.metadata.labels",
        "spec.template.metadata.annotations",
    ]
    assert "`selector` does not match template `labels`" in causes(status)[0][2]


async def test_wrong_types_are_refused_not_crashed_on(k) -> None:
    """Garbage where names go: each is a refusal or ignored as the decoder's business, never a 500."""
    for i, spec in enumerate(
        (
            {"containers": "nope"},
            {"containers": [{"name": 5, "ports": [{"name": ["x"], "containerPort": "80"}]}]},
            {
                "containers": [
                    {"name": "c", "env": [None, 3, {"name": None}], "livenessProbe": {"httpGet": []}}
                ]
            },
            {
                "containers": [{"name": "c", "readinessProbe": {"httpGet": {"port": True}}}],
                "nodeSelector": {"a": 1},
            },
        )
    ):
        code, _ = await post(k, PODS, {"metadata": {"name": f"g{i}"}, "spec": spec})
        assert code in (201, 422), spec


async def post_raw(k: Any, path: str, raw: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(k.url + path, data=raw, headers={"Content-Type": "application/json"}) as resp,
    ):
        return resp.status, await resp.json()


@pytest.mark.parametrize(
    ("where", "field"),
    [
        ('"metadata": {"name": "\\ud800"}', "metadata.name"),
        ('"metadata": {"name": "s", "labels": {"a": "\\udc00x"}}', "metadata.labels"),
        (
            '"metadata": {"name": "s"}, "spec": {"containers": [{"name": "c", "image": "x", '
            '"ports": [{"name": "m\\ud800", "containerPort": 1}]}]}',
            "spec.containers[0].ports[0].name",
        ),
        (
            '"metadata": {"name": "s"}, "spec": {"containers": [{"name": "c", "image": "x", '
            '"env": [{"name": "\\udfff"}]}]}',
            "spec.containers[0].env[0].name",
        ),
    ],
)
async def test_a_lone_surrogate_is_read_as_go_reads_it_and_refused_never_a_500(
    k, where: str, field: str
) -> None:
    """JSON may escape half a UTF-16 pair ("\\ud800"), which is no character: Go's decoder reads each as
    U+FFFD, so a real server refuses the name with 422; a Python string keeps the half, which no UTF-8
    length check can encode."""
    code, status = await post_raw(k, PODS, '{"apiVersion": "v1", "kind": "Pod", ' + where + "}")
    assert code == 422, status
    assert field in [c[1] for c in causes(status)]
    assert "\ufffd" in status["message"]
    # A whole pair is one character (U+1F600), no replacement: still no valid name, still a 422.
    code, status = await post_raw(k, PODS, '{"metadata": {"name": "\\ud83d\\ude00"}}')
    assert code == 422 and "\U0001f600" in status["message"], status


async def test_selector_values_of_the_wrong_type_are_no_500(k) -> None:
    deployment = {
        "metadata": {"name": "d"},
        "spec": {
            "selector": {"matchLabels": {"a": "x"}, "matchExpressions": [{"key": "a", "operator": "In"}]},
            "template": {"metadata": {"labels": {"a": "x"}}, "spec": {"containers": [{"name": "c"}]}},
        },
    }
    for i, values in enumerate((5, "abc", {"x": 1}, True)):
        deployment["metadata"]["name"] = f"d{i}"
        deployment["spec"]["selector"]["matchExpressions"][0]["values"] = values
        code, status = await post(k, "/apis/apps/v1/namespaces/default/deployments", deployment)
        assert code in (201, 400, 422), (values, status)


async def test_the_same_port_name_in_two_containers_of_a_pod_is_accepted(k) -> None:
    """Port names are unique within a container (validateContainerPorts' set is per container), not
    across the pod: a sidecar may name its port "metrics" like the main container does."""
    body = pod(ports=[{"name": "metrics", "containerPort": 1}])
    body["spec"]["containers"].append(
        {"name": "side", "image": "y", "ports": [{"name": "metrics", "containerPort": 2}]}
    )
    body["spec"]["initContainers"] = [
        {"name": "init", "image": "z", "ports": [{"name": "metrics", "containerPort": 3}]}
    ]
    code, status = await post(k, PODS, body)
    assert code == 201, status


async def test_an_invalid_port_name_twice_in_a_container_is_not_also_a_duplicate(k) -> None:
    """validateContainerPorts counts a name as seen only once it is valid: no Duplicate cause for it."""
    body = pod(ports=[{"name": "a--b", "containerPort": 1}, {"name": "a--b", "containerPort": 2}])
    code, status = await post(k, PODS, body)
    assert code == 422
    assert [c[:2] for c in causes(status)] == [
        ("FieldValueInvalid", C0 + "ports[0].name"),
        ("FieldValueInvalid", C0 + "ports[1].name"),
    ]


@pytest.mark.parametrize(
    ("toleration", "field", "says"),
    [
        (
            {"key": "gpu", "operator": "Equal", "value": "a b"},
            "operator",
            'Invalid value: "a b": a valid label',
        ),
        ({"key": "gpu", "value": "v" * 64}, "operator", "must be no more than 63 bytes"),
        ({"operator": "Equal"}, "operator", "operator must be Exists when `key` is empty"),
        ({"key": "gpu", "operator": "Exists", "value": "x"}, "operator", "value must be empty when"),
        ({"key": "gpu", "operator": "In"}, "operator", 'Unsupported value: "In"'),
        ({"key": "gpu", "operator": "Exists", "effect": "NoRun"}, "effect", 'Unsupported value: "NoRun"'),
        (
            {"key": "gpu", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5},
            "effect",
            "effect must be 'NoExecute' when `tolerationSeconds` is set",
        ),
    ],
)
async def test_a_toleration_the_api_server_refuses(
    k, toleration: dict[str, Any], field: str, says: str
) -> None:
    """ValidateTolerations: the value is a label value (under Equal), an empty key needs Exists, Exists
    takes no value, the operator and effect are of their enums."""
    body = pod()
    body["spec"]["tolerations"] = [{"key": "ok", "operator": "Exists"}, toleration]
    code, status = await post(k, PODS, body)
    assert code == 422, status
    assert [c[1] for c in causes(status)] == [f"spec.tolerations[1].{field}"]
    assert says in causes(status)[0][2]


async def test_the_tolerations_a_real_server_takes_are_taken(k) -> None:
    body = pod()
    body["spec"]["tolerations"] = [
        {"operator": "Exists"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "gpu", "value": "a100"},
        {"key": "gpu", "operator": "Equal", "value": "", "effect": "PreferNoSchedule"},
        {
            "key": "node.kubernetes.io/unreachable",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 30,
        },
    ]
    code, status = await post(k, PODS, body)
    assert code == 201, status


@pytest.mark.parametrize("port", [{"name": "m"}, {"name": "m", "containerPort": 0}, {"containerPort": None}])
async def test_a_container_port_without_its_number_is_required(k, port: dict[str, Any]) -> None:
    """validateContainerPorts: containerPort 0 (absent, to the decoder) is Required, not out of range."""
    code, status = await post(k, PODS, pod(ports=[port]))
    assert code == 422, status
    assert causes(status) == [("FieldValueRequired", C0 + "ports[0].containerPort", "Required value")]


def deployment(selector: dict[str, Any], labels: dict[str, str], name: str = "d") -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "selector": selector,
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "c", "image": "i"}]},
            },
        },
    }


DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"


@pytest.mark.parametrize(
    "expression",
    [
        {"key": "tier", "operator": "In", "values": ["db"]},
        {"key": "tier", "operator": "NotIn", "values": ["web"]},
        {"key": "zone", "operator": "Exists"},
        {"key": "tier", "operator": "DoesNotExist"},
    ],
)
async def test_a_selector_expression_that_does_not_select_the_template_is_refused(
    k, expression: dict[str, Any]
) -> None:
    """The API server matches the whole selector, expressions included, against the template's labels."""
    body = deployment(
        {"matchLabels": {"app": "x"}, "matchExpressions": [expression]}, {"app": "x", "tier": "web"}
    )
    code, status = await post(k, DEPLOYMENTS, body)
    assert code == 422, status
    assert [c[1] for c in causes(status)] == ["spec.template.metadata.labels"]
    assert "`selector` does not match template `labels`" in causes(status)[0][2]


async def test_a_selector_of_expressions_only_that_selects_the_template_is_taken(k) -> None:
    body = deployment(
        {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["web"]}]}, {"tier": "web"}
    )
    code, status = await post(k, DEPLOYMENTS, body)
    assert code == 201, status


@pytest.mark.parametrize(
    ("expression", "cause"),
    [
        (
            {"key": "tier", "operator": "In", "values": []},
            (
                "FieldValueRequired",
                "values",
                "Required value: must be specified when `operator` is 'In' or 'NotIn'",
            ),
        ),
        (
            {"key": "tier", "operator": "Exists", "values": ["web"]},
            (
                "FieldValueForbidden",
                "values",
                "Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            ),
        ),
        (
            {"key": "tier", "operator": "Has"},
            ("FieldValueInvalid", "operator", 'Invalid value: "Has": not a valid selector operator'),
        ),
    ],
)
async def test_a_selector_requirement_the_api_server_refuses(
    k, expression: dict[str, Any], cause: tuple[str, str, str]
) -> None:
    body = deployment(
        {"matchLabels": {"app": "x"}, "matchExpressions": [expression]}, {"app": "x", "tier": "web"}
    )
    code, status = await post(k, DEPLOYMENTS, body)
    assert code == 422, status
    reason, field, message = cause
    assert (reason, f"spec.selector.matchExpressions[0].{field}", message) in causes(status)
