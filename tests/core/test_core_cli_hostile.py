"""The one-shot commands (`inventory`, `preflight`, `pick`, `labels`, `slices`) against a hostile user:
each bad input is one line on stderr and exit 2, never a hang, a traceback, the whole of /dev/zero in
memory, an escape sequence reaching the terminal, or an error printed where the output goes.

What needs the process's own descriptors (a closed or full stdout or stderr, a FIFO that could hang)
runs the real console script; the rest calls main() as the other CLI tests do."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nodefabric_devicemanager.commands import infile
from nodefabric_devicemanager.testing import scenarios
from nodefabric_operator.console import main

CLI = [sys.executable, "-m", "nodefabric_operator.console"]
MATRIX = {"0": {"1": "NV18"}, "1": {"0": "NV18"}}
RECORD = {"kind": "Devices", "metadata": {"name": "n1"}, "spec": {}}

# Each command that reads a file, with its arguments around the file's path.
READERS = {
    "labels": lambda path: ["labels", "-f", path],
    "slices": lambda path: ["slices", "--node-name", "n1", "-f", path],
    "pick": lambda path: ["pick", "--links", path, "--count", "1"],
}


def run(args, *, shell="", timeout=60, **kwargs):
    """The console script; `shell` redirections (`<&-`, `2>/dev/full`) applied by sh before it starts."""
    return subprocess.run(
        ["sh", "-c", f'exec "$@" {shell}', "sh", *CLI, *args],
        capture_output=True,
        check=False,
        timeout=timeout,
        **kwargs,
    )


def one_line_error(err: str) -> str:
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1, err
    assert "\x1b" not in err, err
    return err


# --- the file a command is handed -------------------------------------------------------------------


@pytest.mark.parametrize("command", sorted(READERS))
def test_a_fifo_with_no_writer_is_refused_at_once_not_waited_on(tmp_path, command):
    """The open of a FIFO for reading waits for a writer: for ever, if none comes (the run's timeout
    would fail the test)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    proc = run(READERS[command](str(fifo)), timeout=60)
    assert proc.returncode == 2
    err = one_line_error(proc.stderr.decode())
    assert err == f"nodefabric {command}: cannot read {fifo}: it is a FIFO that gave nothing (no writer)\n"


def test_a_pipe_with_a_writer_is_read_as_process_substitution_gives_it(tmp_path):
    """`nodefabric pick --links <(kubectl get devices n -o json)`: a /dev/fd path to a pipe still works."""
    read, write = os.pipe()
    os.write(write, json.dumps(MATRIX).encode())
    os.close(write)
    try:
        proc = subprocess.run(
            [*CLI, "pick", "--links", f"/dev/fd/{read}", "--count", "2"],
            capture_output=True,
            check=False,
            timeout=60,
            pass_fds=(read,),
        )
    finally:
        os.close(read)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().splitlines()[0] == "0,1"


@pytest.mark.parametrize("command", sorted(READERS))
def test_a_device_that_never_ends_is_capped_not_read_whole(command, capsys):
    assert main(READERS[command]("/dev/zero")) == 2
    err = one_line_error(capsys.readouterr().err)
    assert f"cannot read /dev/zero: it is larger than {infile.MAX_BYTES:,} bytes" in err


def test_a_file_over_the_cap_is_refused_whole(tmp_path, capsys):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(infile.MAX_BYTES + 1)  # sparse: the size costs no disk
    assert main(["labels", "-f", str(big)]) == 2
    assert "is larger than" in one_line_error(capsys.readouterr().err)


def test_a_large_real_record_is_well_under_the_cap(tmp_path, capsys):
    """256 VFs: a real record is read whole, by labels and slices alike, far under the cap."""
    bench = scenarios.bench(tmp_path / "host", pfs=8, vfs=32)
    assert main(["inventory", "--root", str(bench.host.root), "-o", "json"]) == 0
    path = tmp_path / "devices.json"
    path.write_text(json.dumps({**RECORD, **json.loads(capsys.readouterr().out)}))
    assert 32 * path.stat().st_size < infile.MAX_BYTES
    assert main(["labels", "-f", str(path)]) == 0
    assert "feature.gpustack.ai/rdma.capable=true" in capsys.readouterr().out.splitlines()
    assert main(["slices", "-f", str(path), "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["items"]


@pytest.mark.parametrize("command", sorted(READERS))
def test_a_closed_standard_input_is_one_line(command):
    proc = run(READERS[command]("-"), shell="<&-")
    assert proc.returncode == 2
    err = one_line_error(proc.stderr.decode())
    assert err == f"nodefabric {command}: cannot read -: standard input is closed\n"


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "it is a directory"),
        (b"", "it is empty"),
        (b" \n\t\n", "it holds only whitespace"),
        (b"\xff\xfe{}", "it is not UTF-8 text (can't decode byte 0xff at offset 0)"),
        (
            b"kind: Devices\nmetadata: {name: \xc3}\n",
            "it is not UTF-8 text (can't decode byte 0xc3 at offset 31)",
        ),
        (b"\xef\xbb\xbfkind: \x80", "it is not UTF-8 text (can't decode byte 0x80 at offset 9)"),
    ],
)
@pytest.mark.parametrize("command", sorted(READERS))
def test_a_file_that_holds_no_text_says_what_it_holds(tmp_path, capsys, command, content, says):
    path = tmp_path / "input"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    assert main(READERS[command](str(path))) == 2
    err = one_line_error(capsys.readouterr().err)
    assert err == f"nodefabric {command}: cannot read {path}: {says}\n"


def test_a_leading_byte_order_mark_is_dropped(tmp_path, capsys):
    """Some editors start UTF-8 with a BOM; json refuses it ("Unexpected UTF-8 BOM")."""
    path = tmp_path / "m.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(MATRIX).encode())
    assert main(["pick", "--links", str(path), "--count", "2"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "0,1"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(RECORD).encode())
    assert main(["labels", "-f", str(path), "-o", "json"]) == 0


@pytest.mark.parametrize("command", ["labels", "slices"])
def test_a_control_character_in_the_file_never_reaches_the_terminal(tmp_path, capsys, command):
    """YAML's error quotes the line it stopped at, and YAML allows a right-to-left override there (it
    refuses an ESC itself): printed escaped, it cannot reorder what the terminal shows."""
    path = tmp_path / "rlo.yaml"
    path.write_text("kind: Devices\nmetadata: {name: [\u202edesrever}\n")
    assert main(READERS[command](str(path))) == 2
    err = one_line_error(capsys.readouterr().err)
    assert "\\u202e" in err and "\u202e" not in err


# --- pick ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("groups", [5, True, 1.5])
def test_pick_a_devices_object_whose_groups_is_not_a_list(tmp_path, capsys, groups):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"kind": "Devices", "spec": {"groups": groups}}))
    assert main(["pick", "--links", str(path), "--count", "1"]) == 2
    err = one_line_error(capsys.readouterr().err)
    assert f"spec.groups is {type(groups).__name__}, not a list" in err


@pytest.mark.parametrize(
    ("count", "says"),
    [
        ("\u0663", "'\u0663' is not a whole number (plain ASCII decimal digits)"),
        ("1_0", "'1_0' is not a whole number"),
        (" 2 ", "' 2 ' is not a whole number"),
        ("0x2", "'0x2' is not a whole number"),
        ("", "'' is not a whole number"),
        ("9" * 5000, f"'{'9' * 32}... (5000 characters)' is more devices than pick chooses among"),
    ],
)
def test_pick_count_is_a_plain_decimal(tmp_path, capsys, count, says):
    """int() takes Unicode digits, underscores and spaces: '\u0663' picked 3 devices."""
    path = tmp_path / "m.json"
    path.write_text(json.dumps(MATRIX))
    with pytest.raises(SystemExit) as exit_:
        main(["pick", "--links", str(path), f"--count={count}"])
    assert exit_.value.code == 2
    err = one_line_error(capsys.readouterr().err)
    assert f"argument --count: {says}" in err and len(err) < 300


@pytest.mark.parametrize("count", ["-5", "-" + "9" * 5000, "0"])
def test_pick_count_below_one_is_refused(tmp_path, capsys, count):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(MATRIX))
    assert main(["pick", "--links", str(path), f"--count={count}"]) == 2
    assert one_line_error(capsys.readouterr().err) == "nodefabric pick: --count must be at least 1\n"


def test_pick_group_on_a_file_that_is_not_a_devices_object_is_refused(tmp_path, capsys):
    """--group was silently ignored for a matrix: the user asked for a group and got something else."""
    path = tmp_path / "m.json"
    path.write_text(json.dumps(MATRIX))
    assert main(["pick", "--links", str(path), "--count", "1", "--group", "amd"]) == 2
    topo = tmp_path / "topo.txt"
    topo.write_text("\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tNV4\t X \n")
    assert main(["pick", "--links", str(topo), "--count", "1", "--group", "amd"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["nodefabric pick: --group chooses a group of a Devices object; this file is not one"] * 2


def test_pick_a_free_index_above_the_largest_says_so(tmp_path, capsys):
    """65000 is a plain decimal out of range, said as numbers.parse says it of any index; 00001 is not
    a plain decimal."""
    path = tmp_path / "m.json"
    path.write_text(json.dumps(MATRIX))
    assert main(["pick", "--links", str(path), "--count", "1", "--free", "0-65000"]) == 2
    err = one_line_error(capsys.readouterr().err)
    assert "device index '65000': outside 0..4095" in err and "not a plain" not in err
    assert main(["pick", "--links", str(path), "--count", "1", "--free", "00001"]) == 2
    err = one_line_error(capsys.readouterr().err)
    assert "device index '00001': not a plain ASCII decimal number" in err


def test_pick_many_missing_free_indices_are_shortened(tmp_path, capsys):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(MATRIX))
    assert main(["pick", "--links", str(path), "--count", "1", "--free", "0-4095"]) == 2
    err = one_line_error(capsys.readouterr().err)
    assert "device(s) 2,3,4,5,6,7,8,9,... (4094 in all) the link matrix does not have" in err
    assert len(err) < 300


# --- --root -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["inventory", "preflight", "slices"])
@pytest.mark.parametrize("kind", ["missing", "file", "empty", "loop"])
def test_a_root_that_is_not_a_directory_is_a_usage_error(tmp_path, capsys, command, kind):
    """A typo in --root is the user's error, not a host whose /sys could not be enumerated (exit 1,
    with conditions blaming the host); and `--root ''` read the real / (slices) or the working
    directory (inventory)."""
    root = str(tmp_path / "root")
    if kind == "file":
        (tmp_path / "root").write_text("x")
    elif kind == "empty":
        root = ""
    elif kind == "loop":
        os.symlink("root", tmp_path / "root")
    extra = ["--node-name", "n1"] if command == "slices" else []
    assert main([command, "--root", root, *extra]) == 2
    err = one_line_error(capsys.readouterr().err)
    if kind == "empty":
        assert err == f"nodefabric {command}: --root is empty (give a directory; / for this host)\n"
    else:
        why = " (nothing is there)" if kind == "missing" else ""
        assert err == f"nodefabric {command}: the host root {root} is not a directory{why}\n"


@pytest.mark.parametrize("command", ["inventory", "preflight"])
@pytest.mark.parametrize("kind", ["missing", "file", "empty"])
def test_a_driver_root_that_is_not_a_directory_is_a_usage_error(tmp_path, capsys, command, kind):
    """It read as a node whose NVML could not be loaded: a condition, and exit 0."""
    bench = scenarios.bench(tmp_path / "host", pfs=1, vfs=0)
    driver = "" if kind == "empty" else str(tmp_path / "driver")
    if kind == "file":
        (tmp_path / "driver").write_text("x")
    assert main([command, "--root", str(bench.host.root), "--driver-root", driver]) == 2
    err = one_line_error(capsys.readouterr().err)
    if kind == "empty":
        assert err.startswith(f"nodefabric {command}: --driver-root is empty")
    else:
        why = " (nothing is there)" if kind == "missing" else ""
        assert err == f"nodefabric {command}: the driver root {driver} is not a directory{why}\n"


def test_a_root_that_is_a_link_to_a_host_tree_is_read(tmp_path, capsys):
    bench = scenarios.bench(tmp_path / "host", pfs=1, vfs=0)
    os.symlink(bench.host.root, tmp_path / "link")
    assert main(["inventory", "--root", str(tmp_path / "link"), "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["spec"]["interfaces"]


# --- escapes in what the user typed ------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["inventory", "\x1b[2Jforged"],  # argparse's "unrecognized arguments" quoted it as typed
        ["slices", "--node-name", "n1", "-f", "\x1b[31m.yaml"],
        ["slices", "--node-name", "n1", "--root", "\x1b[31m"],
        ["inventory", "--root", "\x1b[31m"],
        ["pick", "--links", "\x1b[31m", "--count", "1"],
        ["labels", "-f", "\x1b[31m\n"],
    ],
)
def test_a_control_character_in_an_argument_is_escaped_in_the_error(capsys, args):
    try:
        code = main(args)
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    assert "\\x1b" in one_line_error(capsys.readouterr().err)


# --- stdout and stderr that cannot be written ---------------------------------------------------------


@pytest.mark.parametrize("shell", ["2>&-", "2>/dev/full"])
def test_an_error_that_cannot_be_written_keeps_its_exit_code(tmp_path, shell):
    """With stderr closed, print(file=sys.stderr) wrote the error to standard output (where a
    `| kubectl label` would take it as a label); with stderr full, the message's OSError became a
    traceback that could not be written either, and exit 1."""
    proc = run(["labels", "-f", str(tmp_path / "missing.json")], shell=shell)
    assert proc.returncode == 2
    assert proc.stdout == b""
    assert proc.stderr == b""  # sh's own stderr is the one redirected: nothing reached ours


def test_logs_to_a_full_stderr_do_not_change_the_outcome(tmp_path):
    """inventory logs a warning for a root with no PCI bus; the log line failing is not the pass failing."""
    (tmp_path / "root").mkdir()
    proc = run(["inventory", "--root", str(tmp_path / "root"), "-o", "json"], shell="2>/dev/full")
    assert proc.returncode == 1  # the pass failed (no /sys/class/net), as without the full stderr
    assert json.loads(proc.stdout)["status"]["conditions"]


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["inventory", "--help"]])
@pytest.mark.parametrize(
    ("shell", "says"),
    [(">&-", "standard output is closed"), (">/dev/full", "No space left on device")],
)
def test_version_and_help_to_an_output_that_cannot_be_written(args, shell, says):
    """--version was an AttributeError or OSError traceback; --help exited 0 having printed nothing
    (argparse ignores a write that fails)."""
    proc = run(args, shell=shell)
    assert proc.returncode == 1
    assert one_line_error(proc.stderr.decode()) == f"nodefabric: cannot write the output: {says}\n"


def test_a_usage_error_with_standard_output_closed_is_still_exit_2():
    proc = run(["inventory", "--bogus"], shell=">&-")
    assert proc.returncode == 2
    assert "unrecognized arguments: --bogus" in one_line_error(proc.stderr.decode())


# --- Ctrl-C at start-up -----------------------------------------------------------------------------

# The console script as pip writes it, with SIGINT sent while the console module's own imports run.
INTERRUPTED_IMPORT = """
import os, signal, sys

class Trip:
    def find_spec(self, name, path=None, target=None):
        if name == "nodefabric_devicemanager.logs":
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, Trip())
sys.argv = ["nodefabric", "--version"]
from nodefabric_operator.console import main
sys.exit(main())
"""


def test_ctrl_c_while_the_console_imports_is_a_quiet_exit_130():
    """Before main runs nothing caught it: a KeyboardInterrupt traceback through the import machinery."""
    proc = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_IMPORT], capture_output=True, check=False, timeout=60
    )
    assert (proc.returncode, proc.stderr, proc.stdout) == (130, b"", b"")


def test_the_console_gives_ctrl_c_back_once_imported():
    """A process that imports the console (this one) keeps Python's own KeyboardInterrupt."""
    import signal

    # A suite started as a background job of a non-interactive shell inherits SIGINT ignored, and
    # Python then installs no handler of its own: nothing to check in this process, only in the child,
    # which is started with SIGINT at its default.
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import signal, nodefabric_operator.console\n"
            "assert signal.getsignal(signal.SIGINT) is signal.default_int_handler\n",
        ],
        capture_output=True,
        check=False,
        timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.returncode == 0, proc.stderr.decode()


@pytest.mark.parametrize("args", [["inventory", "-o", "table"], ["inventory", "-o", "yaml"]])
def test_an_output_whose_encoding_cannot_say_a_character(tmp_path, args):
    """PYTHONIOENCODING=ascii (or a Latin-1 locale): the table's "└" was a UnicodeEncodeError traceback."""
    bench = scenarios.bench(tmp_path / "host", pfs=1, vfs=2)
    proc = subprocess.run(
        [*CLI, *args, "--root", str(bench.host.root)],
        capture_output=True,
        check=False,
        timeout=60,
        env={**os.environ, "PYTHONIOENCODING": "ascii"},
    )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert proc.stdout.isascii()
    if "table" in args:
        assert "\\u2514" in proc.stdout.decode()  # the VF rows' "└", written as stderr writes it


def test_a_message_that_quotes_a_huge_input_is_cut(tmp_path, capsys):
    """topo's parser named every unexpected header column: 200,000 of them were a 2.4 MB line. It names
    the first 8 and how many in all now; a message still too long would be cut where it is printed."""
    path = tmp_path / "topo.txt"
    path.write_text("\t" + "\t".join(f"GPU{i}" for i in range(200_000)) + "\nGPU0\tX\n")
    assert main(["pick", "--links", str(path), "--count", "1"]) == 2
    err = one_line_error(capsys.readouterr().err)
    assert err.startswith("nodefabric pick: not nvidia-smi topo -m output: line 1: unexpected header column")
    assert len(err) < 2100 and err.endswith(" in all)\n")


def test_standard_input_that_is_a_terminal_is_read_to_its_end_and_says_so(tmp_path):
    """`nodefabric pick --links -` typed at a terminal: it says it waits for the input, then reads it
    to Ctrl-D."""
    import pty

    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        [*CLI, "pick", "--links", "-", "--count", "2"],
        stdin=terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    os.close(terminal)
    try:
        os.write(controller, json.dumps(MATRIX).encode() + b"\n\x04")  # the line, then Ctrl-D
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(controller)
    assert proc.returncode == 0, err.decode()
    assert err.decode() == "reading the input from the terminal; end it with Ctrl-D\n"
    assert out.decode().splitlines()[0] == "0,1"


@pytest.mark.parametrize("command", ["labels", "slices"])
@pytest.mark.parametrize("syntax", ["yaml", "json"])
def test_a_document_of_too_many_values_is_refused_before_it_is_loaded(tmp_path, capsys, command, syntax):
    """PyYAML's loader builds a node per value first: 16 MiB of `[1,1,...]` took it four minutes and
    5.7 GB. 300,000 values (0.6 MB) are counted from the parser's events and refused at once."""
    path = tmp_path / f"many.{syntax}"
    values = "1," * 300_000 + "1"
    path.write_text(f"kind: Devices\nspec: [{values}]\n" if syntax == "yaml" else f'{{"spec": [{values}]}}')
    assert main(READERS[command](str(path))) == 2
    err = one_line_error(capsys.readouterr().err)
    assert err == (
        f"nodefabric {command}: cannot read {path}: it holds more than 250,000 values "
        "(a Devices record of 1,024 VFs holds about 50,000)\n"
    )


def test_pick_a_device_named_only_as_a_peer_is_not_blamed_on_free(tmp_path, capsys):
    """Without --free the error said `--free names device(s) 1 ... (it has [0, 1])`: a flag not given,
    and a device it said was there."""
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"0": {"1": "NV18"}}))
    assert main(["pick", "--links", str(path), "--count", "1"]) == 2
    assert one_line_error(capsys.readouterr().err) == (
        "nodefabric pick: the link matrix names device(s) 1 only as a peer, "
        "with no row of its own (rows: [0])\n"
    )
    assert main(["pick", "--links", str(path), "--count", "1", "--free", "1"]) == 2
    assert one_line_error(capsys.readouterr().err) == (
        "nodefabric pick: --free names device(s) 1 the link matrix does not have (rows: [0])\n"
    )
