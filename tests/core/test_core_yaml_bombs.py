"""Every command that reads a YAML file a person hands it refuses an alias bomb in one line (exit 2):
the loader shares aliased values, so 1 KB of nested aliases loads at once as a billion values and hangs
whatever walks it next (validation, a node list, a kubeconfig merge)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodefabric_devicemanager import yamldoc
from nodefabric_operator.console import main


def bomb(path: Path, under: str) -> Path:
    """A document whose `under` key holds 2**30 values once its aliases are expanded."""
    lines = ["x0: &a0 [x, x]"] + [f"x{i}: &a{i} [*a{i - 1}, *a{i - 1}]" for i in range(1, 30)]
    path.write_text("\n".join([*lines, f"{under}: *a29"]) + "\n")
    return path


@pytest.mark.parametrize(
    ("under", "argv", "message"),
    [
        ("spec", ["slices", "--node-name", "n1", "-f", "{path}"], "nodefabric slices: cannot read {path}"),
        ("levels", ["extender", "--config", "{path}"], "cannot read extender config {path}"),
        ("items", ["extender", "--nodes-file", "{path}"], "cannot read nodes file {path}"),
        (
            "clusters",
            ["agent", "--node-name", "n1", "--root", "{root}", "--kubeconfig", "{path}"],
            "kubeconfig {path} cannot be read",
        ),
        # The kubernetes library's loader (operator, extender, crd) formats each entry into a string.
        ("users", ["operator", "--kubeconfig", "{path}"], "kubeconfig {path} is malformed"),
        ("users", ["extender", "--kubeconfig", "{path}"], "kubeconfig {path} is malformed"),
        ("users", ["crd", "apply", "--kubeconfig", "{path}"], "kubeconfig {path} is malformed"),
    ],
)
def test_an_alias_bomb_is_one_line_and_exit_2(tmp_path, capsys, under, argv, message) -> None:
    path = bomb(tmp_path / "bomb.yaml", under)
    assert main([a.format(path=path, root=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert message.format(path=path) in err
    assert "expands to more than 2,000,000 values (every YAML alias expanded)" in err
    assert len(err.strip().splitlines()) == 1


def test_anchors_a_person_writes_load_as_written() -> None:
    doc = yamldoc.load("base: &b {mtu: 9000}\na: *b\nb: *b\nlist: &l [1, 2]\nmore: [*l, *l]\n")
    assert doc["a"] == doc["b"] == {"mtu": 9000}
    assert doc["more"] == [[1, 2], [1, 2]]
    # the root, three 2-value mappings, the list (3), and `more` (1 + 2 lists of 3)
    assert yamldoc.expanded_size(doc) == 1 + 3 * 2 + 3 + 7


@pytest.mark.parametrize(
    "argv",
    [
        ["labels", "-f", "{path}"],
        ["slices", "--node-name", "n1", "-f", "{path}"],
        ["extender", "--config", "{path}"],
        ["extender", "--nodes-file", "{path}"],
        ["agent", "--node-name", "n1", "--root", "{root}", "--kubeconfig", "{path}"],
        ["extender", "--kubeconfig", "{path}"],
        ["operator", "--kubeconfig", "{path}"],
        ["crd", "apply", "--kubeconfig", "{path}"],
    ],
)
def test_a_document_nested_too_deep_is_one_line_and_exit_2(tmp_path, capsys, argv) -> None:
    """50,000 nested lists in 100 KB: the YAML composer recurses once per level, so it raised
    RecursionError, which escaped as a 3,000-line traceback from a kubeconfig or the extender's config."""
    path = tmp_path / "deep.yaml"
    path.write_text("clusters: " + "[" * 50_000 + "]" * 50_000 + "\n")
    assert main([a.format(path=path, root=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "nested too deep" in err, err
    assert len(err.strip().splitlines()) == 1, err
