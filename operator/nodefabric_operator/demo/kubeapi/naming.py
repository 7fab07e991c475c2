"""The API server's naming and format rules beyond ObjectMeta: each kind's name rule, and the names inside
the specs of the built-in kinds a chart renders (pod templates, Services, selectors, ConfigMap keys).

The OpenAPI schema (what `kubernetes-validate` checks) says only "string" for these fields; the API
server's Go validation refuses, for example, a container port name of 16 characters (an IANA service name
has at most 15). One set of rules serves both the embedded API (which refuses such writes with 422
Invalid, the field path and apimachinery's message) and the chart tests (which apply it to every render).

Environment variable names follow the strict rule (`[-._a-zA-Z][-._a-zA-Z0-9]*`, IsEnvVarName), on purpose,
though the server version this API reports (1.34) does not: RelaxedEnvironmentVariableValidation is beta
and on from 1.32 and locked on from 1.34, taking any printable ASCII but '='. The chart admits 1.30 and
1.31, which enforce the strict rule, and these rules exist to refuse what any cluster it admits would.
Only what is well-typed is checked: a field of the wrong JSON type is the decoder's refusal, not these.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from nodefabric_operator.demo.kubeapi.errors import ApiError, Cause
from nodefabric_operator.demo.kubeapi.validation import (
    NAME_PART_MAX,
    SUBDOMAIN_MAX,
    annotations_causes,
    check_meta_types,
    dns_label_errors,
    forbidden,
    go_value,
    invalid,
    label_value_errors,
    labels_causes,
    meta_causes,
    qualified_name_errors,
    required,
    subdomain_errors,
)

PORT_NAME_MAX = 15
_PORT_CHARSET_RE = re.compile("[-a-z0-9]+")
_PORT_LETTER_RE = re.compile("[a-z]")
_DNS1035_FMT = "[a-z]([-a-z0-9]*[a-z0-9])?"
_DNS1035_RE = re.compile(_DNS1035_FMT)
_DNS1035_MSG = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
    "alphabetic character, and end with an alphanumeric character"
)
_ENV_FMT = "[-._a-zA-Z][-._a-zA-Z0-9]*"
_ENV_RE = re.compile(_ENV_FMT)
_ENV_MSG = (
    "a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', "
    "and must not start with a digit"
)
_CONFIG_KEY_FMT = "[-._a-zA-Z0-9]+"
_CONFIG_KEY_RE = re.compile(_CONFIG_KEY_FMT)
_CONFIG_KEY_MSG = "a valid config key must consist of alphanumeric characters, '-', '_' or '.'"
_PORT_RANGE = "must be between 1 and 65535, inclusive"

RBAC_GROUP = "rbac.authorization.k8s.io"
_RBAC_KINDS = frozenset({"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"})
# Kinds whose spec.template is a pod template and whose spec.selector must select it.
_WORKLOADS = frozenset(
    {("apps", "Deployment"), ("apps", "DaemonSet"), ("apps", "ReplicaSet"), ("apps", "StatefulSet")}
)
_DUPLICATE = "FieldValueDuplicate"
_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


# --- syntax (apimachinery's util/validation, message for message) ---------------------------------------


def _regex(msg: str, fmt: str, *examples: str) -> str:
    quoted = " or ".join(f"'{e}', " for e in examples)
    return f"{msg} (e.g. {quoted}regex used for validation is '{fmt}')"


def port_name_errors(value: str) -> list[str]:
    """IsValidPortName: an IANA service name (RFC 6335), as container ports, named probe ports and a
    Service's targetPort must be."""
    errs = []
    if len(value.encode()) > PORT_NAME_MAX:
        errs.append(f"must be no more than {PORT_NAME_MAX} bytes")
    if not _PORT_CHARSET_RE.fullmatch(value):
        errs.append("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")
    if not _PORT_LETTER_RE.search(value):
        errs.append("must contain at least one letter (a-z)")
    if "--" in value:
        errs.append("must not contain consecutive hyphens")
    if value and (value[0] == "-" or value[-1] == "-"):
        errs.append("must not begin or end with a hyphen")
    return errs


def port_number_errors(value: int) -> list[str]:
    return [] if 1 <= value <= 65535 else [_PORT_RANGE]


def dns1035_label_errors(value: str) -> list[str]:
    """IsDNS1035Label: a Service's name (it becomes a DNS name and an environment variable prefix)."""
    errs = []
    if len(value.encode()) > NAME_PART_MAX:
        errs.append(f"must be no more than {NAME_PART_MAX} bytes")
    if not _DNS1035_RE.fullmatch(value):
        errs.append(_regex(_DNS1035_MSG, _DNS1035_FMT, "my-name", "abc-123"))
    return errs


def _chdir_prefix(value: str) -> list[str]:
    if value in (".", ".."):
        return [f"must not be '{value}'"]
    return ["must not start with '..'"] if value.startswith("..") else []


def env_var_name_errors(value: str) -> list[str]:
    """IsEnvVarName (strict): env[].name and envFrom[].prefix."""
    errs = []
    if not _ENV_RE.fullmatch(value):
        errs.append(_regex(_ENV_MSG, _ENV_FMT, "my.env-name", "MY_ENV.NAME", "MyEnvName1"))
    return errs + _chdir_prefix(value)


def config_key_errors(value: str) -> list[str]:
    """IsConfigMapKey: the keys of a ConfigMap's or Secret's data (each becomes a file name)."""
    errs = []
    if len(value.encode()) > SUBDOMAIN_MAX:
        errs.append(f"must be no more than {SUBDOMAIN_MAX} bytes")
    if not _CONFIG_KEY_RE.fullmatch(value):
        errs.append(_regex(_CONFIG_KEY_MSG, _CONFIG_KEY_FMT, "key.name", "KEY_NAME", "key-name"))
    return errs + _chdir_prefix(value)


def path_segment_errors(value: str) -> list[str]:
    """IsValidPathSegmentName: RBAC objects' names ("system:foo" is one)."""
    if value in (".", ".."):
        return [f"may not be '{value}'"]
    return [f"may not contain '{c}'" for c in ("/", "%") if c in value]


def name_rule(group: str, kind: str) -> Callable[[str], list[str]]:
    """The rule the API server applies to metadata.name of this kind."""
    if not group and kind == "Namespace":
        return dns_label_errors
    if not group and kind == "Service":
        return dns1035_label_errors
    if group == RBAC_GROUP and kind in _RBAC_KINDS:
        return path_segment_errors
    return subdomain_errors


# --- specs ----------------------------------------------------------------------------------------------


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _items(value: Any) -> Iterator[tuple[int, Mapping[str, Any]]]:
    if isinstance(value, list):
        yield from ((i, v) for i, v in enumerate(value) if isinstance(v, Mapping))


def _strings(value: Any) -> dict[str, str]:
    """A map of strings (labels, selectors); entries of other types are `type_causes`' business."""
    return {k: v for k, v in _map(value).items() if isinstance(k, str) and isinstance(v, str)}


def type_causes(value: Any, field: str) -> list[Cause]:
    """A map[string]string field holding something else: a real server cannot decode it (a YAML `1` or
    `true` left unquoted in a label is the usual way to get one)."""
    return [
        Cause("FieldValueTypeInvalid", f"{field}[{k}]", f"Invalid value: {go_value(v)}: must be a string")
        for k, v in _map(value).items()
        if not isinstance(v, str)
    ]


def _labels(value: Any, field: str) -> list[Cause]:
    return type_causes(value, field) + labels_causes(_strings(value), field)


def _each(field: str, value: str, errs: list[str]) -> list[Cause]:
    return [invalid(field, value, msg) for msg in errs]


def _duplicate(field: str, value: Any) -> Cause:
    return Cause(_DUPLICATE, field, f"Duplicate value: {go_value(value)}")


def port_ref_causes(field: str, port: Any) -> list[Cause]:
    """ValidatePortNumOrName: a probe's port or a Service's targetPort, a number or a port name."""
    if isinstance(port, bool):
        return []
    if isinstance(port, int):
        return [invalid(field, port, m) for m in port_number_errors(port)]
    if isinstance(port, str):
        return _each(field, port, port_name_errors(port))
    return []


def selector_causes(selector: Any, field: str) -> list[Cause]:
    """ValidateLabelSelector: matchLabels as labels, matchExpressions' keys (and In/NotIn values)."""
    sel = _map(selector)
    causes = _labels(sel.get("matchLabels"), f"{field}.matchLabels")
    for i, expr in _items(sel.get("matchExpressions")):
        path = f"{field}.matchExpressions[{i}]"
        operator, values = expr.get("operator"), expr.get("values")
        values = values if isinstance(values, list) else []  # another type is the decoder's refusal
        if operator in ("In", "NotIn"):
            if not values:
                causes.append(
                    required(f"{path}.values", "must be specified when `operator` is 'In' or 'NotIn'")
                )
        elif operator in ("Exists", "DoesNotExist"):
            if values:
                detail = "may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
                causes.append(forbidden(f"{path}.values", detail))
        elif isinstance(operator, str) or operator is None:
            causes.append(invalid(f"{path}.operator", operator or "", "not a valid selector operator"))
        key = expr.get("key")
        if isinstance(key, str):
            causes += _each(f"{path}.key", key, qualified_name_errors(key))
        for j, value in enumerate(values):
            if isinstance(value, str):
                causes += _each(f"{path}.values[{j}]", value, label_value_errors(value))
    return causes


def _selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """LabelSelectorAsSelector(...).Matches(labels): matchLabels and every well-formed expression."""
    if any(labels.get(k) != v for k, v in _strings(selector.get("matchLabels")).items()):
        return False
    for _, expr in _items(selector.get("matchExpressions")):
        key, operator, values = expr.get("key"), expr.get("operator"), expr.get("values")
        values = values if isinstance(values, list) else []
        have = labels.get(key) if isinstance(key, str) else None
        present = have is not None
        if operator == "In" and have not in values:
            return False
        if operator == "NotIn" and present and have in values:
            return False
        if (operator == "Exists" and not present) or (operator == "DoesNotExist" and present):
            return False
    return True


def _probe_causes(container: Mapping[str, Any], path: str) -> list[Cause]:
    causes: list[Cause] = []
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        spec = _map(container.get(probe))
        for handler in ("httpGet", "tcpSocket"):
            if handler in spec and "port" in _map(spec[handler]):
                field = f"{path}.{probe}.{handler}.port"
                causes += port_ref_causes(field, _map(spec[handler])["port"])
        grpc = _map(spec.get("grpc"))
        if isinstance(grpc.get("port"), int) and not isinstance(grpc["port"], bool):
            causes += [
                invalid(f"{path}.{probe}.grpc.port", grpc["port"], m)
                for m in port_number_errors(grpc["port"])
            ]
    return causes


def _container_causes(container: Mapping[str, Any], path: str, volumes: set[str]) -> list[Cause]:
    causes: list[Cause] = []
    # Unique within the container (validateContainerPorts), not the pod; a name counts once it is valid.
    port_names: set[str] = set()
    name = container.get("name")
    if isinstance(name, str):
        causes += _each(f"{path}.name", name, dns_label_errors(name) if name else [])
        if not name:
            causes.append(required(f"{path}.name"))
    for j, port in _items(container.get("ports")):
        pname = port.get("name")
        if isinstance(pname, str) and pname:
            errs = port_name_errors(pname)
            causes += _each(f"{path}.ports[{j}].name", pname, errs)
            if not errs and pname in port_names:
                causes.append(_duplicate(f"{path}.ports[{j}].name", pname))
            elif not errs:
                port_names.add(pname)
        number = port.get("containerPort")
        field = f"{path}.ports[{j}].containerPort"
        if number is None or (number == 0 and not isinstance(number, bool)):
            causes.append(required(field))  # what the decoder makes of an absent number
        elif isinstance(number, int) and not isinstance(number, bool):
            causes += [invalid(field, number, m) for m in port_number_errors(number)]
    for j, env in _items(container.get("env")):
        ename = env.get("name")
        if isinstance(ename, str):
            field = f"{path}.env[{j}].name"
            causes += [required(field)] if not ename else _each(field, ename, env_var_name_errors(ename))
    for j, source in _items(container.get("envFrom")):
        prefix = source.get("prefix")
        if isinstance(prefix, str) and prefix:
            causes += _each(f"{path}.envFrom[{j}].prefix", prefix, env_var_name_errors(prefix))
    for j, mount in _items(container.get("volumeMounts")):
        mname = mount.get("name")
        if isinstance(mname, str) and mname not in volumes:
            causes.append(
                Cause("FieldValueNotFound", f"{path}.volumeMounts[{j}].name", f"Not found: {go_value(mname)}")
            )
    return causes + _probe_causes(container, path)


def pod_spec_causes(spec: Any, path: str) -> list[Cause]:
    """ValidatePodSpec's names: volumes, containers (ports, env, mounts, probes), the service account,
    priority class, node selector and toleration keys."""
    spec = _map(spec)
    causes: list[Cause] = []
    volumes: set[str] = set()
    for i, volume in _items(spec.get("volumes")):
        vname = volume.get("name")
        if not isinstance(vname, str):
            continue
        field = f"{path}.volumes[{i}].name"
        causes += [required(field)] if not vname else _each(field, vname, dns_label_errors(vname))
        if vname in volumes:
            causes.append(_duplicate(field, vname))
        volumes.add(vname)
    containers: set[str] = set()
    for group in ("initContainers", "containers"):
        for i, container in _items(spec.get(group)):
            cpath = f"{path}.{group}[{i}]"
            causes += _container_causes(container, cpath, volumes)
            cname = container.get("name")
            if isinstance(cname, str) and cname:
                if cname in containers:
                    causes.append(_duplicate(f"{cpath}.name", cname))
                containers.add(cname)
    for key in ("serviceAccountName", "priorityClassName"):
        value = spec.get(key)
        if isinstance(value, str) and value:
            causes += _each(f"{path}.{key}", value, subdomain_errors(value))
    causes += _labels(spec.get("nodeSelector"), f"{path}.nodeSelector")
    for i, toleration in _items(spec.get("tolerations")):
        causes += _toleration_causes(toleration, f"{path}.tolerations[{i}]")
    return causes


def _not_supported(field: str, value: str, supported: tuple[str, ...]) -> Cause:
    allowed = ", ".join(f'"{v}"' for v in supported)
    return Cause(
        "FieldValueNotSupported", field, f"Unsupported value: {go_value(value)}: supported values: {allowed}"
    )


def _toleration_causes(toleration: Mapping[str, Any], path: str) -> list[Cause]:
    """ValidateTolerations: a qualified-name key; an empty key only with Exists; Exists with no value;
    under Equal (or no operator) a label value; tolerationSeconds only with NoExecute; known enums."""
    key, operator, value, effect = (toleration.get(f, "") for f in ("key", "operator", "value", "effect"))
    if not all(isinstance(v, str) for v in (key, operator, value, effect)):
        return []  # the decoder's refusal
    causes: list[Cause] = []
    if key:
        causes += _each(f"{path}.key", key, qualified_name_errors(key))
    elif operator != "Exists":
        detail = 'operator must be Exists when `key` is empty, which means "match all values and all keys"'
        causes.append(invalid(f"{path}.operator", operator, detail))
    if toleration.get("tolerationSeconds") is not None and effect != "NoExecute":
        detail = "effect must be 'NoExecute' when `tolerationSeconds` is set"
        causes.append(invalid(f"{path}.effect", effect, detail))
    if operator in ("", "Equal"):
        errs = label_value_errors(value)
        if errs:
            causes.append(invalid(f"{path}.operator", value, ";".join(errs)))
    elif operator == "Exists":
        if value:
            detail = "value must be empty when `operator` is 'Exists'"
            causes.append(invalid(f"{path}.operator", dict(toleration), detail))
    else:
        causes.append(_not_supported(f"{path}.operator", operator, ("Equal", "Exists")))
    if effect and effect not in _TAINT_EFFECTS:
        causes.append(_not_supported(f"{path}.effect", effect, _TAINT_EFFECTS))
    return causes


def pod_template_causes(template: Any, path: str) -> list[Cause]:
    """ValidatePodTemplateSpec: the template's labels and annotations, then its pod spec."""
    meta = _map(_map(template).get("metadata"))
    causes = _labels(meta.get("labels"), f"{path}.metadata.labels")
    causes += type_causes(meta.get("annotations"), f"{path}.metadata.annotations")
    causes += annotations_causes(_strings(meta.get("annotations")), f"{path}.metadata.annotations")
    return causes + pod_spec_causes(_map(template).get("spec"), f"{path}.spec")


def _workload_causes(kind: str, spec: Mapping[str, Any]) -> list[Cause]:
    causes = selector_causes(spec.get("selector"), "spec.selector")
    selector = _map(spec.get("selector"))
    template = _map(spec.get("template"))
    labels = _strings(_map(template.get("metadata")).get("labels"))
    match = _strings(selector.get("matchLabels"))
    if not match and not selector.get("matchExpressions"):
        causes.append(
            invalid("spec.selector", dict(selector), f"empty selector is invalid for {kind.lower()}")
        )
    elif not _selects(selector, labels):
        causes.append(
            invalid("spec.template.metadata.labels", labels, "`selector` does not match template `labels`")
        )
    return causes + pod_template_causes(template, "spec.template")


def _service_causes(spec: Mapping[str, Any]) -> list[Cause]:
    causes: list[Cause] = []
    ports = list(_items(spec.get("ports")))
    names: set[str] = set()
    for i, port in ports:
        path = f"spec.ports[{i}]"
        name = port.get("name")
        if isinstance(name, str) and name:
            # A Service's own port names are DNS labels; its targetPort names a container port.
            causes += _each(f"{path}.name", name, dns_label_errors(name))
            if name in names:
                causes.append(_duplicate(f"{path}.name", name))
            names.add(name)
        elif len(ports) > 1:
            causes.append(required(f"{path}.name"))
        number = port.get("port")
        if isinstance(number, int) and not isinstance(number, bool):
            causes += [invalid(f"{path}.port", number, m) for m in port_number_errors(number)]
        if "targetPort" in port and port["targetPort"] not in (0, ""):
            causes += port_ref_causes(f"{path}.targetPort", port["targetPort"])
    return causes + _labels(spec.get("selector"), "spec.selector")


def spec_causes(group: str, kind: str, obj: Mapping[str, Any]) -> list[Cause]:
    """The causes the API server's validation of this kind finds in the object's body (not metadata)."""
    spec = _map(obj.get("spec"))
    if (group, kind) in _WORKLOADS:
        return _workload_causes(kind, spec)
    if (group, kind) == ("batch", "Job"):
        causes = selector_causes(spec.get("selector"), "spec.selector")
        name = _map(obj.get("metadata")).get("name")
        if isinstance(name, str) and name and not spec.get("manualSelector"):
            # The API server labels the Job's pods with its name (batch.kubernetes.io/job-name): a name
            # that is no label value (over 63 bytes) is refused there.
            causes += _each("spec.template.labels", name, label_value_errors(name))
        return causes + pod_template_causes(spec.get("template"), "spec.template")
    if (group, kind) == ("", "Pod"):
        return pod_spec_causes(spec, "spec")
    if (group, kind) == ("", "Service"):
        return _service_causes(spec)
    if (group, kind) == ("policy", "PodDisruptionBudget"):
        return selector_causes(spec.get("selector"), "spec.selector")
    if (group, kind) in (("", "ConfigMap"), ("", "Secret")):
        keys: list[Cause] = []
        for data in ("data", "binaryData", "stringData"):
            for key in _map(obj.get(data)):
                if isinstance(key, str):
                    keys += _each(f"{data}[{key}]", key, config_key_errors(key))
        return keys
    return []


def object_causes(obj: Mapping[str, Any]) -> list[Cause]:
    """Everything above for one manifest, as `kubectl apply` would send it: its metadata under its kind's
    name rule, its namespace (a DNS label, as the API path's is), then its spec. The namespace is not
    required: a chart's cluster-scoped kinds have none, and a namespaced one takes the request's."""
    api_version = obj.get("apiVersion")
    kind = obj.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return [required("kind" if not isinstance(kind, str) else "apiVersion")]
    group = api_version.rpartition("/")[0]
    meta = _map(obj.get("metadata"))
    try:
        check_meta_types(meta)
    except ApiError as err:
        return [Cause("FieldValueTypeInvalid", "metadata", err.message)]
    causes = meta_causes(meta, name_errors=name_rule(group, kind))
    namespace = meta.get("namespace")
    if isinstance(namespace, str) and namespace:
        causes += _each("metadata.namespace", namespace, dns_label_errors(namespace))
    return causes + spec_causes(group, kind, obj)
