"""`nodefabric operator --topology` start-up problems, through the real command: one log line, exit 2."""

from __future__ import annotations

import pytest

from nodefabric_operator.console import main


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip() and " aiohttp.access " not in line]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--topology-targets", "kueue,slurm"], "unknown topology targets ['slurm']"),
        (
            ["--topology-levels", '[{"name": "a", "keys": ["k"]}, {"name": "b", "keys": ["k"]}]'],
            "is in levels a",
        ),
        (["--topology-levels", "[{name: a, keys: [kubernetes.io/hostname]}]"], "added by every projection"),
        (["--topology-levels", "[{name: a, keys: ['bad key']}]"], "not a qualified label key"),
        (["--topology-levels", "{name: a}"], "invalid topology levels"),
        (["--topology-levels", "[: nope"], "--topology:"),
        (["--topology-levels", "[]"], "at least one topology level"),
        (["--topology-levels", "[" * 5000], "--topology:"),
        (["--topology-name", "Bad_Name"], "--topology-name 'Bad_Name' is not a DNS label"),
        (["--topology-level-keys", "{rack: [k]}"], "level keys for ['rack']: no such level"),
        (["--topology-level-keys", "[leaf]"], "invalid level keys"),
    ],
)
def test_bad_topology_configuration_is_one_line_and_exit_2(args: list[str], message: str, capsys) -> None:
    assert main(["operator", "--standalone", "--topology", *args]) == 2
    line = one_line(capsys.readouterr().err)
    assert '"invalid arguments"' in line and message in line, line


def test_a_malformed_debounce_is_refused_by_the_parser(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["operator", "--topology", "--topology-debounce", "nan"])
    assert exit_.value.code == 2
    assert "argument --topology-debounce" in capsys.readouterr().err
