"""The `nodefabric` console script (issue 14): --version, one `-o json|yaml|table` on every command that
prints, log options before or after the subcommand, and user errors as one line with exit 2."""

from __future__ import annotations

import importlib.metadata
import io
import json
import os
import subprocess
import sys

import pytest
import yaml

from nodefabric_devicemanager.testing.scenarios import SCENARIOS
from nodefabric_operator import console
from nodefabric_operator.console import main


@pytest.fixture
def host_root(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    return root


CLI = [sys.executable, "-m", "nodefabric_operator.console"]


def script(*args, stdin=None):
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        input=stdin,
    )


def test_version():
    proc = script("--version")
    assert proc.returncode == 0
    assert proc.stdout == f"nodefabric {importlib.metadata.version('nodefabric')}\n"


@pytest.mark.parametrize(
    "args",
    [
        ["--log-level", "loud", "inventory"],
        ["inventory", "--log-level", "loud"],
        ["inventory", "--log-format", "xml"],
        ["inventory", "-o", "csv"],
        ["pick", "--links", "x", "--count", "two"],
        ["no-such-command"],
        [],
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(args):
    proc = script(*args)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("nodefabric") and "error:" in proc.stderr


def test_a_bad_log_level_names_the_levels():
    proc = script("inventory", "--log-level", "loud")
    assert "'loud' is not a log level (one of debug, info, warning, error, critical)" in proc.stderr


@pytest.mark.parametrize("where", ["before", "after"])
def test_log_options_work_before_and_after_the_subcommand(host_root, where):
    SCENARIOS["down-beside-working"](host_root)
    log = ["--log-format", "json", "--log-level", "warning"]
    cmd = ["inventory", "--root", str(host_root)]
    proc = script(*(log + cmd if where == "before" else cmd + log))
    assert proc.returncode == 0
    lines = [json.loads(line) for line in proc.stderr.splitlines()]
    assert lines and all(line["level"] == "warning" for line in lines)
    assert any(line["msg"] == "rdma link is down" for line in lines)


def test_an_option_before_the_subcommand_is_not_undone_by_the_default_after_it(host_root):
    SCENARIOS["down-beside-working"](host_root)  # logs a Warning at the default level
    assert "rdma link is down" in script("inventory", "--root", str(host_root)).stderr
    proc = script("--log-level", "error", "inventory", "--root", str(host_root))
    assert proc.returncode == 0 and proc.stderr == ""


# --- -o json|yaml|table, the same on every command ----------------------------------------------------


def test_inventory_prints_json_yaml_and_a_table_with_the_accelerators(host_root, capsys):
    SCENARIOS["gpu8"](host_root)
    docs = {}
    for fmt in ("json", "yaml"):
        assert main(["inventory", "--root", str(host_root), "-o", fmt]) == 0
        out = capsys.readouterr().out
        docs[fmt] = json.loads(out) if fmt == "json" else yaml.safe_load(out)
    assert docs["json"] == docs["yaml"]
    assert main(["inventory", "--root", str(host_root), "--output", "table"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("ACCELERATOR")))
    assert lines[header].split() == ["ACCELERATOR", "INDEX", "PCI", "NUMA", "LINKS", "FABRIC"]
    gpus = [line.split() for line in lines[header + 1 : header + 9]]
    assert [g[:4] for g in gpus[:2]] == [
        ["nvidia", "0", "0000:18:00.0", "0"],
        ["nvidia", "1", "0000:19:00.0", "0"],
    ]
    # GPU0 shares a switch with GPU1, a socket with GPU2 and GPU3, and nothing with the other four.
    assert gpus[0][4] == "PIX:1,NODE:2,SYS:4" and gpus[0][5] == "-"
    # No NVML on this machine: said once, under the table, with the remedy.
    assert any(line.startswith("NvidiaFabricRead=False LibraryUnavailable") for line in lines)


def test_preflight_prints_json_and_yaml_with_the_nodes_verdict(host_root, capsys):
    SCENARIOS["down-beside-working"](host_root)
    assert main(["preflight", "--root", str(host_root), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(e["name"], e["verdict"]) for e in doc["endpoints"]] == [("ens1np0", "failed"), ("ens2np0", "ok")]
    assert doc["counts"] == {"ok": 1, "unverified": 0, "failed": 1} and doc["rdmaCapable"] is True
    assert main(["preflight", "--root", str(host_root), "-o", "yaml"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == doc


def test_preflight_json_of_a_failed_pass_has_no_verdict(host_root, capsys):
    SCENARIOS["escaping-symlink"](host_root)
    assert main(["preflight", "--root", str(host_root), "-o", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert "rdmaCapable" not in doc
    assert doc["conditions"][0]["type"] == "InterfacesEnumerated"


def test_labels_prints_text_table_json_and_yaml(host_root, capsys, monkeypatch):
    SCENARIOS["down-beside-working"](host_root)
    main(["inventory", "--root", str(host_root)])
    record = {"kind": "Devices", "metadata": {"name": "n"}, **json.loads(capsys.readouterr().out)}
    outputs = {}
    for fmt in ("text", "table", "json", "yaml"):
        monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(record)))
        assert main(["labels", "-f", "-", "-o", fmt]) == 0
        outputs[fmt] = capsys.readouterr().out
    assert outputs["text"].splitlines() == [
        "feature.gpustack.ai/rdma.capable=true",
        "feature.gpustack.ai/rdma.numa=0",
    ]
    assert outputs["table"].splitlines()[0].split() == ["LABEL", "VALUE"]
    assert outputs["table"].splitlines()[1].split() == ["feature.gpustack.ai/rdma.capable", "true"]
    assert (
        json.loads(outputs["json"])
        == yaml.safe_load(outputs["yaml"])
        == {
            "feature.gpustack.ai/rdma.capable": "true",
            "feature.gpustack.ai/rdma.numa": "0",
        }
    )


def test_labels_of_a_file_that_is_no_record_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("metadata: {name: n}\nspec: {interfaces: [{mtu: lots}]}\n")
    proc = script("labels", "-f", str(bad))
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "cannot read" in proc.stderr and "Traceback" not in proc.stderr


def test_pick_prints_json_yaml_and_keeps_json_as_an_alias(tmp_path, capsys):
    f = tmp_path / "m.json"
    f.write_text(json.dumps({"0": {"1": "PHB", "2": "SYS"}, "1": {"2": "SYS"}, "2": {}}))
    base = ["pick", "--links", str(f), "--count", "2"]
    results = []
    for flag in (["-o", "json"], ["--json"], ["-o", "yaml"]):
        assert main([*base, *flag]) == 0
        out = capsys.readouterr().out
        results.append(yaml.safe_load(out))
    assert results[0] == results[1] == results[2]
    assert results[0]["chosen"] == [0, 1]
    assert main([*base, "-o", "table"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "0,1"


@pytest.mark.parametrize("link", ["NV18\n", "nv18 ", "PIX\n"])
def test_pick_matches_link_names_whole(tmp_path, capsys, link):
    f = tmp_path / "m.json"
    f.write_text(json.dumps({"0": {"1": link}, "1": {}}))
    assert main(["pick", "--links", str(f), "--count", "2"]) == 2
    assert "not one of" in capsys.readouterr().err


@pytest.mark.parametrize("free", ["\u0663", "1_0", "0-99999999999", "+1"])
def test_pick_reads_indices_as_plain_decimals(tmp_path, capsys, free):
    f = tmp_path / "m.json"
    f.write_text(json.dumps({"0": {"1": "SYS"}, "1": {}}))
    assert main(["pick", "--links", str(f), "--free", free, "--count", "1"]) == 2
    assert "--free" in capsys.readouterr().err


def test_no_traceback_for_a_root_that_is_not_a_host(tmp_path):
    """A directory with no /sys in it is a host whose parts could not be enumerated: exit 1, the False
    conditions. (A root that is not a directory at all is a usage error: see test_core_cli_hostile.)"""
    (tmp_path / "empty").mkdir()
    proc = script("inventory", "--root", str(tmp_path / "empty"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    doc = json.loads(proc.stdout)
    assert {c["type"]: c["status"] for c in doc["status"]["conditions"]} == {
        "InterfacesEnumerated": "False",
        "AcceleratorsEnumerated": "False",
    }


def test_a_json_nested_deeper_than_the_parser_goes_is_bad_input(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    for args in (["pick", "--links", str(deep), "--count", "1"], ["labels", "-f", str(deep)]):
        proc = script(*args)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert len(proc.stderr.splitlines()) == 1, proc.stderr


# --- the dispatcher names every subcommand's module -------------------------------------------------


@pytest.mark.parametrize("name", sorted(console.COMMANDS))
def test_every_subcommand_loads_a_module_with_arguments_and_run(name):
    loader, help_ = console.COMMANDS[name]
    module = loader()
    assert help_ and callable(module.add_arguments) and callable(module.run)
    _, command = console.build_parser([name])
    assert command is module


def test_a_missing_third_party_package_is_one_line_naming_it(monkeypatch, capsys):
    def needs_kmock():
        raise ModuleNotFoundError("No module named 'kmock'", name="kmock")

    monkeypatch.setitem(console.COMMANDS, "demo", (needs_kmock, "run the demo"))
    with pytest.raises(SystemExit) as exited:
        console.main(["demo"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "needs the Python package kmock" in err


def test_a_missing_module_of_ours_is_a_bug_not_a_usage_error(monkeypatch):
    def broken():
        raise ModuleNotFoundError(
            "No module named 'nodefabric_operator.gone'", name="nodefabric_operator.gone"
        )

    monkeypatch.setitem(console.COMMANDS, "demo", (broken, "run the demo"))
    with pytest.raises(ModuleNotFoundError):
        console.main(["demo"])


@pytest.mark.parametrize("output", ["json", "yaml", "table"])
def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path, output):
    """`nodefabric inventory | head`: the reader closes the pipe while the command still writes (the
    record is far larger than a pipe's buffer). The command ends as a filter does on SIGPIPE: code 141,
    nothing on stderr, no traceback."""
    from nodefabric_devicemanager.testing import scenarios

    bench = scenarios.bench(tmp_path / "host", pfs=8, vfs=128)
    proc = subprocess.Popen(
        [*CLI, "inventory", "--root", str(bench.host.root), "-o", output],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline()  # it began writing
    proc.stdout.close()
    err = proc.stderr.read().decode()
    code = proc.wait(120)
    assert err == ""
    # JSON is one write of the whole text: CPython drops the rest of a write the reader cut short midway
    # without raising, so the command ends 0; YAML and the table write piece by piece and hear EPIPE.
    assert code == (0 if output == "json" else 141)


def small_table_to(tmp_path, stdout) -> subprocess.CompletedProcess[bytes]:
    """`nodefabric inventory -o table` of a one-PF host, its output to `stdout`, its stderr kept."""
    from nodefabric_devicemanager.testing import scenarios

    bench = scenarios.bench(tmp_path / "host", pfs=1, vfs=0)
    return subprocess.run(
        [*CLI, "inventory", "--root", str(bench.host.root), "-o", "table"],
        stdout=stdout,
        stderr=subprocess.PIPE,
        check=False,
        timeout=120,
    )


def test_a_reader_gone_before_the_first_write_ends_the_command_quietly(tmp_path):
    """A small output held in the buffer until exit meets the closed pipe at the flush: the same quiet
    end, not an "Exception ignored" at interpreter shutdown."""
    read, write = os.pipe()
    os.close(read)  # no reader at all, before the command starts
    try:
        proc = small_table_to(tmp_path, write)
    finally:
        os.close(write)
    assert proc.returncode == 141, proc.stderr.decode()
    assert proc.stderr == b""


def test_a_broken_pipe_that_is_not_the_output_is_still_a_traceback(monkeypatch, capsys):
    """Only the output's reader going away is a quiet end: a command's own socket failing the same way
    is a bug to show."""

    class Failing:
        def run(self, args):
            raise BrokenPipeError(32, "Broken pipe (a socket of its own)")

    parser = console.argparse.ArgumentParser()
    monkeypatch.setattr(console, "build_parser", lambda argv: (parser, Failing()))
    parser.add_argument("--log-format", default="text")
    parser.add_argument("--log-level", default="info")
    with pytest.raises(BrokenPipeError):
        main([])


def test_an_output_that_cannot_be_written_is_one_line(tmp_path):
    """Output to a full disk (/dev/full answers ENOSPC): one line naming it, exit 1, no traceback."""
    with open("/dev/full", "w") as full:
        proc = small_table_to(tmp_path, full)
    assert proc.returncode == 1
    assert proc.stderr.decode() == "nodefabric: cannot write the output: No space left on device\n"


def test_a_closed_standard_output_is_one_line(tmp_path):
    """Started with standard output closed (`>&-`): Python gives the process no sys.stdout at all."""
    from nodefabric_devicemanager.testing import scenarios

    bench = scenarios.bench(tmp_path / "host", pfs=1, vfs=0)
    proc = subprocess.run(
        ["sh", "-c", 'exec "$@" >&-', "sh", *CLI, "inventory", "--root", str(bench.host.root)],
        capture_output=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr.decode() == "nodefabric: cannot write the output: standard output is closed\n"
    assert proc.stdout == b""


def test_main_gives_back_the_standard_output_it_was_given(capsys, tmp_path):
    """A caller's stdout (here pytest's capture) is its own again once main returns, however it ends."""
    before = sys.stdout
    with pytest.raises(SystemExit):
        main(["pick", "--help"])  # argparse prints the help and exits from inside the command's parser
    assert sys.stdout is before
    assert main(["labels", "-f", str(tmp_path / "missing.json")]) == 2
    assert sys.stdout is before
    assert "cannot read" in capsys.readouterr().err
