"""`nodefabric pick --links FILE`: one link spelled two ways is one link, a look-alike of a link name is
no link, and a refusal of a huge file is still a short line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nodefabric_operator.console import main

GROUP = '{{"id":{id},"manufacturer":"NVIDIA","accelerators":[{accs}]}}'
ACC = '{{"id":"a{i}","index":{i},"topology":{{"links":{{"{j}":"{link}"}}}}}}'


def _write(tmp_path: Path, content: str) -> Path:
    path = tmp_path / "links"
    path.write_text(content)
    return path


def _refused(path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    assert main(["pick", "--links", str(path), "--count", "1", *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.splitlines()) == 1, captured.err[:400]
    return captured.err.rstrip("\n").removeprefix("nodefabric pick: ")


def _picked(path: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main(["pick", "--links", str(path), "--count", "2"]) == 0, capsys.readouterr().err
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize(("there", "back"), [("nv4", "NV4"), ("NV04", "NV4"), ("pix", "PIX"), ("Sys", "SYS")])
def test_one_link_spelled_two_ways_is_one_link(tmp_path, capsys, there, back):
    lines = _picked(_write(tmp_path, json.dumps({"0": {"1": there}, "1": {"0": back}})), capsys)
    assert lines[0] == "0,1"


def test_two_different_links_are_still_refused(tmp_path, capsys):
    path = _write(tmp_path, json.dumps({"0": {"1": "NV4"}, "1": {"0": "NV8"}}))
    assert _refused(path, capsys) == "link 0-1 is NV4 but link 1-0 is NV8: one link, two names"


@pytest.mark.parametrize("link", ["p\u0131x", "\u017fys", "l\u0131nk", "nv\uff14"])
def test_a_look_alike_of_a_link_name_is_refused_in_json(tmp_path, capsys, link):
    path = _write(tmp_path, json.dumps([["X", link], [link, "X"]]))
    assert _refused(path, capsys) == (f"link 0-1 is {link!r}, not one of NV<n> LINK PIX PXB PHB NODE SYS UNK")


@pytest.mark.parametrize("link", ["p\u0131x", "\u017fys"])
def test_a_look_alike_of_a_link_name_is_refused_in_topo_text(tmp_path, capsys, link):
    text = f"\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \t{link}\t0-1\nGPU1\t{link}\t X \t0-1\n"
    message = _refused(_write(tmp_path, text), capsys)
    assert message.startswith(f"not nvidia-smi topo -m output: line 2, GPU0/GPU1: {link!r} is not a link")


def test_a_topo_alias_and_its_name_are_one_link(tmp_path, capsys):
    text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tsoc\t0-1\nGPU1\tSYS\t X \t0-1\n"
    assert _picked(_write(tmp_path, text), capsys)[0] == "0,1"


@pytest.mark.parametrize("own", ["12345", '"NV4"', '"garbage"'])
def test_a_json_object_matrix_s_own_cell_is_x_or_null_only(tmp_path, capsys, own):
    path = _write(tmp_path, f'{{"0": {{"0": {own}, "1": "NV4"}}, "1": {{"0": "NV4"}}}}')
    assert _refused(path, capsys).startswith("device 0: its own cell is ")


@pytest.mark.parametrize("own", ['"X"', "null"])
def test_a_json_object_matrix_s_own_cell_may_be_x_or_null(tmp_path, capsys, own):
    path = _write(tmp_path, f'{{"0": {{"0": {own}, "1": "NV4"}}, "1": {{"0": "NV4", "1": "X"}}}}')
    assert _picked(path, capsys)[0] == "0,1"


def test_a_header_of_thousands_of_unknown_columns_is_refused_in_a_short_line(tmp_path, capsys):
    names = "\t".join(f"COL{i}" for i in range(40_000))
    text = f"\tGPU0\tGPU1\t{names}\nGPU0\tX\tNV4\nGPU1\tNV4\tX\n"
    message = _refused(_write(tmp_path, text), capsys)
    assert message.startswith("not nvidia-smi topo -m output: line 1: unexpected header column(s) ['COL0',")
    assert message.endswith("(40,000 in all)")
    assert len(message) < 300


def _devices(*groups: str) -> str:
    head = '{"apiVersion":"worker.gpustack.ai/v1alpha1","kind":"Devices","spec":{"groups":['
    return f"{head}{','.join(groups)}]}}}}"


def _group(gid: str, link: str) -> str:
    accs = ",".join(ACC.format(i=i, j=1 - i, link=link) for i in (0, 1))
    return GROUP.format(id=json.dumps(gid), accs=accs)


def test_a_group_id_named_twice_is_refused_with_group(tmp_path, capsys):
    path = _write(tmp_path, _devices(_group("nvidia", "NV4"), _group("nvidia", "SYS")))
    assert _refused(path, capsys, "--group", "nvidia") == (
        "the Devices object has 2 groups 'nvidia' (spec.groups[0] and [1]): --group cannot choose"
    )


def test_a_devices_object_of_thousands_of_groups_is_refused_in_a_short_line(tmp_path, capsys):
    path = _write(tmp_path, _devices(*(_group(f"g{i}", "NV4") for i in range(3000))))
    message = _refused(path, capsys)
    assert message.startswith("the Devices object has several groups ['g0', 'g1',")
    assert message.endswith("(3,000 in all): pass --group")
    assert len(message) < 300
    message = _refused(path, capsys, "--group", "nope")
    assert message.startswith("no group 'nope' in the Devices object (groups: ['g0', 'g1',")
    assert len(message) < 300
