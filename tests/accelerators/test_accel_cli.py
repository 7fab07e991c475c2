"""`nodefabric pick` through the console script's own entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nodefabric_devicemanager.models import Accelerator, AcceleratorGroup, AcceleratorTopology
from nodefabric_operator.console import main

DATA = Path(__file__).parent / "data"


def test_topo_text_file(capsys):
    assert main(["pick", "--links", str(DATA / "topo_dgx1_cube.txt"), "--free", "1-7", "--count", "4"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "4,5,6,7"
    assert out[1].startswith("slowest link NV1,")
    assert out[2].startswith("lowest free 1,2,3,4 would have slowest link SYS")


def test_json_matrix_and_json_output(tmp_path, capsys):
    f = tmp_path / "m.json"
    f.write_text(json.dumps({"0": {"0": "X", "1": "PHB", "2": "SYS"}, "1": {"2": "SYS"}, "2": {}}))
    assert main(["pick", "--links", str(f), "--free", "0,1,2", "--count", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["chosen"] == [0, 1]
    assert result["slowestLink"] == "PHB"


def test_rows_matrix(tmp_path, capsys):
    f = tmp_path / "rows.json"
    f.write_text(json.dumps([["X", "SYS", "SYS"], ["SYS", "X", "NV2"], ["SYS", "NV2", "X"]]))
    assert main(["pick", "--links", str(f), "--count", "2"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "1,2"


def devices_object(groups):
    return {
        "apiVersion": "worker.gpustack.ai/v1alpha1",
        "kind": "Devices",
        "metadata": {"name": "n1"},
        "spec": {"interfaces": [], "groups": [g.wire() for g in groups]},
    }


def group(gid, links):
    return AcceleratorGroup(
        id=gid,
        manufacturer=gid,
        accelerators=[
            Accelerator(id=f"a{i}", index=i, topology=AcceleratorTopology(links=row))
            for i, row in enumerate(links)
        ],
    )


def test_devices_object_needs_group_when_several(tmp_path, capsys):
    nv = group("nvidia", [{"1": "SYS", "2": "SYS"}, {"0": "SYS", "2": "NV12"}, {"0": "SYS", "1": "NV12"}])
    amd = group("amd", [{"1": "LINK"}, {"0": "LINK"}])
    f = tmp_path / "devices.json"
    f.write_text(json.dumps(devices_object([amd, nv])))
    assert main(["pick", "--links", str(f), "--count", "2"]) == 2
    assert "several groups ['amd', 'nvidia']: pass --group" in capsys.readouterr().err
    assert main(["pick", "--links", str(f), "--count", "2", "--group", "nvidia"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "1,2"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--free", "0,9", "--count", "1"], "does not have"),
        (["--free", "0,x", "--count", "1"], "'x' is not an index or a range"),
        (["--free", "3-1", "--count", "1"], "runs backwards"),
        (["--free", "0,1", "--count", "3"], "more than the 2 free"),
        (["--count", "0"], "at least 1"),
    ],
)
def test_bad_arguments_exit_2_with_a_reason(args, message, capsys):
    assert main(["pick", "--links", str(DATA / "topo_4gpu_phb_sys.txt"), *args]) == 2
    assert message in capsys.readouterr().err


def test_bad_files_exit_2(tmp_path, capsys):
    assert main(["pick", "--links", str(tmp_path / "absent"), "--count", "1"]) == 2
    assert "No such file" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"0": {"1": "FAST"}}')
    assert main(["pick", "--links", str(bad), "--count", "1"]) == 2
    assert "'FAST', not one of" in capsys.readouterr().err
    text = tmp_path / "t.txt"
    text.write_text("hello\n")
    assert main(["pick", "--links", str(text), "--count", "1"]) == 2
    assert "not nvidia-smi topo -m output" in capsys.readouterr().err


def test_console_script_reads_stdin(topo_text):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "nodefabric_operator.console",
            "pick",
            "--links",
            "-",
            "--free",
            "1,2,3",
            "--count",
            "2",
        ],
        input=topo_text("topo_4gpu_phb_sys.txt"),
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.splitlines()[0] == "2,3"


# --- every bad input is a message and exit 2 ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        # A Devices object whose group lacks its id and manufacturer (pydantic refuses it).
        (
            json.dumps({"spec": {"groups": [{"accelerators": [{"id": "a"}]}]}}).encode(),
            "validation error",
        ),
        (b"\xff\xfe{not text", "can't decode byte 0xff"),
        (json.dumps({"-1": {"0": "NV1"}, "0": {"-1": "NV1"}}).encode(), "never negative"),
    ],
    ids=["malformed-devices-object", "not-utf8", "negative-index"],
)
def test_pick_refuses_bad_input_with_a_message(tmp_path, capsys, content, message):
    f = tmp_path / "links"
    f.write_bytes(content)
    assert main(["pick", "--links", str(f), "--count", "2"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("nodefabric pick: ")
    assert message in captured.err


def test_pick_reads_an_old_driver_matrix(capsys):
    f = DATA / "topo_old_driver_nic_names.txt"
    assert main(["pick", "--links", str(f), "--free", "1,2,3", "--count", "2"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "1,2"
