"""The cluster-side components (operator, extender, CRD apply, demo) reach the API through
kubeclient.load_client: a kubeconfig that is missing, unreadable or malformed is a ConfigException with
one line naming the file, and each CLI turns it into exit 2 and one line on stderr, never a traceback (the
agent, which has a client of its own, is held to the same outcome)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from kubernetes.config.config_exception import ConfigException

from nodefabric_devicemanager.kubeclient import load_client

GOOD = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "c", "cluster": {"server": "https://10.0.0.1:6443"}}],
    "users": [{"name": "u", "user": {"token": "t"}}],
    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
    "current-context": "x",
}


def good_with(**changes: object) -> str:
    return yaml.safe_dump({**GOOD, **changes})


# name -> (file content, what the message says besides the file's name)
MALFORMED: dict[str, tuple[bytes, str]] = {
    "bad YAML": (b"apiVersion: v1\nclusters: [\n", "is malformed: not YAML (while parsing a flow node"),
    "a tab-indented YAML": (b"clusters:\n\t- name: c\n", "is malformed: not YAML"),
    "binary": (b"\xff\xfe\x00\x01garbage", "is malformed: not UTF-8 text"),
    "a list": (b"- a\n- b\n", "is malformed: not the shape of a kubeconfig (TypeError"),
    "a scalar": (b"just a string\n", "is malformed: not the shape of a kubeconfig (TypeError"),
    "clusters a number": (
        good_with(clusters=5).encode(),
        "is malformed: not the shape of a kubeconfig (TypeError",
    ),
    "a server that is a number": (
        good_with(clusters=[{"name": "c", "cluster": {"server": 5}}]).encode(),
        "is malformed: not the shape of a kubeconfig (AttributeError",
    ),
    "certificate data that is not base64": (
        good_with(
            clusters=[
                {"name": "c", "cluster": {"server": "https://a", "certificate-authority-data": "!!!x"}}
            ]
        ).encode(),
        "is malformed: a *-data field is not base64",
    ),
    "a context that is a list": (
        good_with(contexts=[{"name": "x", "context": [1]}]).encode(),
        "Invalid kube-config file. Expected key cluster",
    ),
    "empty": (b"", "Invalid kube-config"),
    "no current context": (yaml.safe_dump({k: v for k, v in GOOD.items() if k != "current-context"}).encode(),
                           "Expected key current-context"),
}  # fmt: skip


@pytest.fixture(autouse=True)
def _outside_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_kubeconfig_is_a_config_exception_naming_the_file(tmp_path: Path, case: str) -> None:
    content, says = MALFORMED[case]
    path = tmp_path / "kubeconfig"
    path.write_bytes(content)
    with pytest.raises(ConfigException) as refused:
        load_client(path)
    message = str(refused.value)
    assert message.startswith(f"kubeconfig {path}"), message
    assert says in message and "\n" not in message, message


def test_the_same_from_the_kubeconfig_variable_says_there_is_no_api_to_reach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "config"
    path.write_bytes(b"- not\n- a kubeconfig\n")
    monkeypatch.setenv("KUBECONFIG", str(path))
    with pytest.raises(ConfigException) as refused:
        load_client()
    message = str(refused.value)
    assert message.startswith("no API to reach: not in a cluster and no usable kubeconfig (kubeconfig ")
    assert str(path) in message and "is malformed" in message and message.endswith("pass --kubeconfig")


def test_the_kubeconfig_variable_is_read_when_the_client_is_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not when the kubernetes library was imported (its own default): the operator sets it late."""
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(GOOD))
    monkeypatch.setenv("KUBECONFIG", str(path))
    api = load_client()
    try:
        assert api.configuration.host == "https://10.0.0.1:6443"
        assert api.configuration.retries == 0
    finally:
        api.close()  # type: ignore[no-untyped-call]


def test_a_missing_or_unreadable_kubeconfig_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    with pytest.raises(ConfigException, match=f"^kubeconfig {missing}: Invalid kube-config file"):
        load_client(missing)
    with pytest.raises(ConfigException, match=f"^kubeconfig {tmp_path}: cannot read it: .*Is a directory"):
        load_client(tmp_path)


def test_a_kubeconfig_from_a_pipe_is_read(tmp_path: Path) -> None:
    """`--kubeconfig <(kubectl config view --raw)` hands a FIFO: it is read like a file (with no writer it
    waits for one, as kubectl does)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "w") as f:
            f.write(yaml.safe_dump(GOOD))

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    api = load_client(fifo)
    writer.join(timeout=10)
    try:
        assert api.configuration.host == "https://10.0.0.1:6443"
    finally:
        api.close()  # type: ignore[no-untyped-call]


# Through the real CLIs: exit 2, one line on stderr naming the file, no traceback.


@pytest.fixture
def nodefabric(console):
    """`nodefabric` in this process (tests/conftest.py), never inside a cluster."""
    return lambda *args, env=None: console(*args, env={"KUBERNETES_SERVICE_HOST": "", **(env or {})})


@pytest.mark.parametrize(
    ("command", "case", "says"),
    [
        # The node side reads its kubeconfig with its own small client (nodeclient/), held to the same
        # outcome: the agent and the standalone DRA driver.
        (["agent", "--node-name", "gpu-1", "--root", "{tmp}", "--once"], "bad YAML", "cannot be read"),
        (
            [
                "draplugin",
                "--node-name",
                "gpu-1",
                "--root",
                "{tmp}",
                "--plugin-dir",
                "{tmp}/p",
                "--registry-dir",
                "{tmp}/r",
                "--cdi-dir",
                "{tmp}/c",
            ],
            "bad YAML",
            "cannot be read",
        ),
        (["operator", "--standalone"], "a server that is a number", "is malformed: not the shape"),
        (["extender"], "a list", "is malformed: not the shape"),
        (["crd", "apply"], "certificate data that is not base64", "is malformed: a *-data field"),
    ],
)
def test_each_cli_refuses_a_malformed_kubeconfig_in_one_line(
    nodefabric, tmp_path: Path, command: list[str], case: str, says: str
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_bytes(MALFORMED[case][0])
    args = [a.replace("{tmp}", str(tmp_path)) for a in command]
    done = nodefabric(*args, "--kubeconfig", str(path))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"kubeconfig {path} {says}" in done.stderr and done.stdout == "", done.stderr


def test_a_malformed_default_kubeconfig_is_one_line_too(tmp_path: Path) -> None:
    """The operator's real-process smoke test: the console script, its JSON log line on stderr, exit 2."""
    path = tmp_path / "config"
    path.write_bytes(MALFORMED["binary"][0])
    done = subprocess.run(
        [str(Path(sys.executable).with_name("nodefabric")), "--log-format=json", "operator", "--standalone"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**os.environ, "KUBERNETES_SERVICE_HOST": "", "KUBECONFIG": str(path)},
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.splitlines()
    assert "no API to reach" in line and f"kubeconfig {path} is malformed: not UTF-8 text" in line
