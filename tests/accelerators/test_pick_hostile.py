"""`nodefabric pick --links FILE` against a hostile file: every bad one is one line on stderr and exit 2,
never a traceback, a hang, or a matrix that silently kept one of two values."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nodefabric_devicemanager.pick import MAX_DEVICES
from nodefabric_operator.console import main

GOOD = {"0": {"1": "NV4"}, "1": {"0": "NV4"}}


def devices(*accelerators: str) -> str:
    """A Devices object's JSON with one nvidia group holding `accelerators` (JSON text each)."""
    group = f'{{"id":"nvidia","manufacturer":"NVIDIA","accelerators":[{",".join(accelerators)}]}}'
    return f'{{"apiVersion":"worker.gpustack.ai/v1alpha1","kind":"Devices","spec":{{"groups":[{group}]}}}}'


def acc(index: str, links: str = "{}") -> str:
    return f'{{"id":{json.dumps("a" + index[:8])},"index":{index},"topology":{{"links":{links}}}}}'


def refused(path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    """Runs pick on `path`; asserts exit 2, nothing on stdout and one line on stderr; returns that line."""
    assert main(["pick", "--links", str(path), "--count", "1", *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "Traceback" not in captured.err
    assert len(captured.err.splitlines()) == 1, captured.err
    assert captured.err.startswith("nodefabric pick: ")
    return captured.err.rstrip("\n").removeprefix("nodefabric pick: ")


def write(tmp_path: Path, content: str | bytes, name: str = "links") -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def test_a_good_matrix_is_still_picked(tmp_path, capsys):
    assert main(["pick", "--links", str(write(tmp_path, json.dumps(GOOD))), "--count", "2"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "0,1"


# --- the file itself -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (bytes(range(256)) * 4, "is not UTF-8 text (can't decode byte 0x80 at offset 128)"),
        (b"\xff\xfe{}", "is not UTF-8 text (can't decode byte 0xff at offset 0)"),
        (b"", "it is empty"),
        (b" \n\t", "it holds only whitespace"),
    ],
)
def test_bytes_that_are_no_text_are_refused(tmp_path, capsys, content, says):
    assert says in refused(write(tmp_path, content), capsys)


def test_a_missing_file_is_refused(tmp_path, capsys):
    assert (
        refused(tmp_path / "nothing", capsys)
        == f"cannot read {tmp_path / 'nothing'}: No such file or directory"
    )


def test_a_fifo_with_no_writer_is_refused_without_waiting(tmp_path, capsys):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert refused(fifo, capsys) == f"cannot read {fifo}: it is a FIFO that gave nothing (no writer)"


# --- JSON of the wrong shape -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (
            '{"0": {"1": "NV4"}, "0": {"1": "SYS"}, "1": {"0": "NV4"}}',
            "the key '0' appears twice in one object",
        ),
        ('{"0": {"1": "NV4", "1": "SYS"}, "1": {"0": "NV4"}}', "the key '1' appears twice in one object"),
        ('{"0": {"1": 5}, "1": {"0": "NV4"}}', "link 0-1 is int 5, not a link name"),
        ('{"0": {"1": true}, "1": {"0": "NV4"}}', "link 0-1 is bool True, not a link name"),
        ('{"0": {"1": null}, "1": {"0": "NV4"}}', "link 0-1 is null, not a link name"),
        ('{"0": {"1": NaN}, "1": {"0": "NV4"}}', "link 0-1 is float nan, not a link name"),
        ('{"0": [1], "1": {}}', "device '0' maps to list"),
        (
            '{"0": {"1": "NV4"}, "1": {"0": "SYS"}}',
            "link 0-1 is NV4 but link 1-0 is SYS: one link, two names",
        ),
        ('{"-1": {}}', "device indices are never negative"),
        ('{"1.5": {}}', "device index '1.5': not a plain ASCII decimal number"),
        ('{"00": {}}', "device index '00': not a plain ASCII decimal number"),
        ('{"4096": {}}', "device index '4096': outside 0..4095"),
        (f'{{"{10**400}": {{}}}}', "(401 characters)': outside 0..4095"),
        ("[1, 2]", "row 0 of the JSON matrix is not a list of 2 cells"),
        ("[[1]]", "row 0 of the JSON matrix: its own cell is 1, expected X"),
        ('[["X", 7], [7, "X"]]', "link 0-1 is int 7, not a link name"),
        ('"GPU0"', "not nvidia-smi topo -m output"),
        ("[" * 100_000, "not valid JSON: the document is nested too deep"),
        ('{"0": {"1": "NV4"}', "not valid JSON: Expecting ',' delimiter"),
    ],
)
def test_a_json_matrix_of_the_wrong_shape_is_refused(tmp_path, capsys, content, says):
    assert says in refused(write(tmp_path, content), capsys)


# --- Devices objects -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("index", "says"),
    [
        ('"0"', "spec.groups[0].accelerators[0].index is str '0', not a whole number"),
        ("1.0", "spec.groups[0].accelerators[0].index is float 1.0, not a whole number"),
        ("true", "spec.groups[0].accelerators[0].index is bool True, not a whole number"),
        ("[0]", "spec.groups[0].accelerators[0].index is list [0], not a whole number"),
        ("-1", "spec.groups[0].accelerators[0].index is -1: device indices are 0..4095"),
        ("4096", "spec.groups[0].accelerators[0].index is 4096: device indices are 0..4095"),
        ("2147483647", "spec.groups[0].accelerators[0].index is 2147483647: device indices are 0..4095"),
        (str(10**400), "not valid JSON for pick: a number of 401 digits"),
        ("9" * 5000, "not valid JSON for pick: a number of 5,000 digits"),
    ],
)
def test_a_devices_object_index_that_is_no_device_index_is_refused(tmp_path, capsys, index, says):
    path = write(tmp_path, devices(acc(index)))
    assert refused(path, capsys) == says


def test_a_devices_object_listing_an_index_twice_is_refused(tmp_path, capsys):
    """The second accelerator 0 replaced the first's links: the pick used whichever came last."""
    path = write(
        tmp_path, devices(acc("0", '{"1": "NV4"}'), acc("0", '{"1": "SYS"}'), acc("1", '{"0": "NV4"}'))
    )
    assert refused(path, capsys) == (
        "spec.groups[0].accelerators[1].index: device index 0 is listed twice (also accelerators[0])"
    )


def test_a_devices_object_naming_a_key_twice_is_refused(tmp_path, capsys):
    text = devices(acc("0", '{"1": "NV4"}'), acc("1", '{"0": "NV4"}')).replace('"kind"', '"spec":{},"kind"')
    assert (
        refused(write(tmp_path, text), capsys)
        == "not valid JSON for pick: the key 'spec' appears twice in one object"
    )


def test_a_malformed_group_is_named_by_its_field_in_one_clause(tmp_path, capsys):
    path = write(tmp_path, devices(acc("0", '{"1": 5}')))
    assert refused(path, capsys) == (
        "spec.groups[0].accelerators.0.topology.links.1: Input should be a valid string, got 5 "
        "(1 validation error)"
    )


# --- nvidia-smi topo -m text -----------------------------------------------------------------------


def topo_text(names: list[str]) -> str:
    header = "\t" + "\t".join(names)
    rows = ["\t".join([n, *("X" if m == n else "NV4" for m in names)]) for n in names]
    return "\n".join([header, *rows]) + "\n"


def test_a_topo_index_above_the_largest_is_refused(tmp_path, capsys):
    assert (
        refused(write(tmp_path, topo_text(["GPU0", "GPU5000"])), capsys)
        == "device index 5000: outside 0..4095"
    )


def test_two_topo_names_of_one_gpu_are_refused(tmp_path, capsys):
    """GPU0 and GPU00 are one index: the second row's links replaced the first's."""
    says = refused(write(tmp_path, topo_text(["GPU0", "GPU00"])), capsys)
    assert says == "not nvidia-smi topo -m output: line 1: GPU 0 is named by two columns"


def test_a_topo_link_read_two_ways_is_refused(tmp_path, capsys):
    text = "\tGPU0\tGPU1\nGPU0\tX\tNV4\nGPU1\tSYS\tX\n"
    assert (
        refused(write(tmp_path, text), capsys) == "link 0-1 is NV4 but link 1-0 is SYS: one link, two names"
    )


def test_a_header_of_100000_equal_columns_is_refused(tmp_path, capsys):
    """columns.count() for every column was quadratic: this header held the command for minutes."""
    text = "\t" + "\t".join(["GPU0"] * 100_000) + "\nGPU0\tX\n"
    says = refused(write(tmp_path, text), capsys)
    assert says == "not nvidia-smi topo -m output: line 1: column(s) ['GPU0'] named twice"


def test_a_topo_of_1700_gpus_is_refused_by_its_header(tmp_path, capsys):
    """11 MB of cells: refused from the header's GPU count, before a cell is read (a bad cell in the
    last row is never reached)."""
    names = [f"GPU{i}" for i in range(1700)]
    text = topo_text(names).rstrip("\n")[:-2] + "??\n"
    assert refused(write(tmp_path, text), capsys) == (
        f"the link matrix has 1700 devices; pick chooses among at most {MAX_DEVICES} "
        "(the search's time bound holds up to there)"
    )
