"""The process shell's flags, start-up error and signals, through every long-running command's own parser
and through a real process receiving SIGTERM."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import subprocess
import sys
import textwrap
import time
from types import ModuleType

import pytest

from nodefabric_devicemanager import logs
from nodefabric_devicemanager.agent import cli as agent_cli
from nodefabric_devicemanager.shell.errors import MAX_REASON_CHARS, StartupError, first_line, one_line, refuse
from nodefabric_devicemanager.shell.flags import Listen, listen
from nodefabric_deviceplugin import cli as deviceplugin_cli
from nodefabric_deviceplugin.dra import cli as draplugin_cli
from nodefabric_operator import cli as operator_cli
from nodefabric_operator.admission import cli as placement_cli
from nodefabric_operator.extender import cli as extender_cli

COMMANDS: dict[str, ModuleType] = {
    "agent": agent_cli,
    "deviceplugin": deviceplugin_cli,
    "draplugin": draplugin_cli,
    "operator": operator_cli,
    "extender": extender_cli,
    "placement": placement_cli,
}
# Each command's defaults, as before the flags were shared (the chart passes what it wants).
DEFAULTS = {
    "agent": Listen("0.0.0.0", 9464, 8081),
    "deviceplugin": Listen("0.0.0.0", None, None),
    "draplugin": Listen("0.0.0.0", None, None),
    "operator": Listen("0.0.0.0", None, None),
    "extender": Listen("0.0.0.0", None, None),
    "placement": Listen("0.0.0.0", 8080, 8080),
}


def parse(command: str, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    COMMANDS[command].add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_spells_the_address_and_ports_the_same(command: str) -> None:
    assert listen(parse(command)) == DEFAULTS[command]
    both = listen(
        parse(command, "--bind-address", "127.0.0.1", "--metrics-port", "9100", "--health-port", "9101")
    )
    assert both == Listen("127.0.0.1", 9100, 9101)
    # The extender's and placement's older spelling is the same flag on every command.
    assert listen(parse(command, "--metrics-address", "::1", "--metrics-port", "9100")).host == "::1"


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("bad", ["70000", "-1", "x", "", " 80", "\uff18\uff10", "nan"])
def test_every_command_refuses_a_port_that_is_none(command: str, bad: str, capsys) -> None:
    for flag in ("--metrics-port", "--health-port"):
        parser = argparse.ArgumentParser()
        COMMANDS[command].add_arguments(parser)
        with pytest.raises(SystemExit) as exc:
            parser.parse_args([flag, bad])
        assert exc.value.code == 2 and f"argument {flag}" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["agent", "deviceplugin", "draplugin", "extender", "placement"])
def test_a_port_of_0_is_off(command: str) -> None:
    assert listen(parse(command, "--metrics-port", "0", "--health-port", "0")) == Listen(
        "0.0.0.0", None, None
    )


def test_the_probes_follow_the_metrics_port_unless_the_health_port_is_given() -> None:
    assert listen(parse("deviceplugin", "--metrics-port", "9000")) == Listen("0.0.0.0", 9000, 9000)
    assert listen(parse("deviceplugin", "--metrics-port", "9000", "--health-port", "0")).health_port is None
    assert listen(parse("placement", "--health-port", "8081")) == Listen("0.0.0.0", 8080, 8081)
    assert listen(parse("placement", "--metrics-port", "0")) == Listen("0.0.0.0", None, None)


def test_the_operator_still_refuses_port_0_its_ports_being_off_unless_given(capsys) -> None:
    parser = argparse.ArgumentParser()
    operator_cli.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--metrics-port", "0"])
    assert "argument --metrics-port" in capsys.readouterr().err


@pytest.mark.parametrize("command", COMMANDS)
def test_an_empty_address_is_refused(command: str) -> None:
    with pytest.raises(ValueError, match="--bind-address is empty"):
        listen(parse(command, "--bind-address", " "))


@pytest.mark.parametrize("command", ["deviceplugin", "draplugin", "extender", "placement"])
def test_an_empty_address_stops_the_command_at_start(command: str, caplog, tmp_path) -> None:
    argv = ["--bind-address", "", "--node-name", "n1"] if command == "draplugin" else ["--bind-address", ""]
    if command in ("deviceplugin", "draplugin"):
        argv += ["--plugin-dir", str(tmp_path / "p")]
    if command == "draplugin":
        argv += [
            "--registry-dir",
            str(tmp_path / "r"),
            "--cdi-dir",
            str(tmp_path / "c"),
            "--root",
            str(tmp_path),
        ]
    with caplog.at_level(logging.ERROR):
        assert COMMANDS[command].run(parse(command, *argv)) == 2
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert record.getMessage() == f"{command} cannot start"
    assert "--bind-address is empty" in record.error  # type: ignore[attr-defined]


# --- the start-up error --------------------------------------------------------------------------------


def test_refuse_is_one_structured_line_and_exit_2(caplog) -> None:
    log = logging.getLogger("nodefabric_test.shell")
    err = StartupError("the plugin directory /x is not a directory")
    with caplog.at_level(logging.ERROR):
        assert refuse(log, "agent", err, node="gpu-1") == 2
    (record,) = caplog.records
    line = logs.KeyValueFormatter().format(record)
    assert "\n" not in line
    assert '"agent cannot start"' in line and 'error="the plugin directory /x is not a directory"' in line
    assert "node=gpu-1" in line
    assert json.loads(logs.JsonFormatter().format(record))["error"] == str(err)


def test_a_many_line_reason_keeps_every_line_on_one() -> None:
    pydantic_like = "1 validation error for ExtenderConfig\ndefaultRank\n  Input should be 'a' or 'b'\n"
    assert (
        one_line(pydantic_like)
        == "1 validation error for ExtenderConfig; defaultRank; Input should be 'a' or 'b'"
    )
    assert first_line(pydantic_like) == "1 validation error for ExtenderConfig"


def test_a_huge_or_empty_reason_is_bounded_or_named() -> None:
    assert len(one_line("x" * 10**6)) == MAX_REASON_CHARS
    assert one_line("\n".join(["y"] * 10**5)).endswith("...")
    assert one_line(OSError()) == "OSError"
    assert one_line("") == "no reason given"
    assert issubclass(StartupError, ValueError), "the configuration checks raise either"


# --- signals -------------------------------------------------------------------------------------------

PROGRAM = textwrap.dedent(
    """
    import asyncio, sys, threading
    from nodefabric_devicemanager import logs
    from nodefabric_devicemanager.shell.signals import stop_on_signals

    logs.configure(level="INFO")
    stuck = sys.argv[1] == "stuck"

    async def main() -> int:
        stop = asyncio.Event()
        with stop_on_signals(stop, grace=1.0, node="n1"):
            print("ready", flush=True)
            await stop.wait()
            if stuck:  # a part that never stops: a thread blocked forever, awaited
                await asyncio.to_thread(threading.Event().wait)
        if sys.argv[1] == "cleanup":  # clean-up after the signals' block: closing sockets, joining threads
            await asyncio.sleep(0.6)
            print("cleaned up", flush=True)
        return 0

    sys.exit(asyncio.run(main()))
    """
)


def _run_until_sigterm(mode: str) -> tuple[int, float, str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=15)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None
    return code, took, proc.stderr.read()


def test_sigterm_stops_a_command_cleanly() -> None:
    code, took, err = _run_until_sigterm("clean")
    assert code == 0 and took < 1.0, (code, took, err)
    assert "stopping on signal" in err and "SIGTERM" in err and "did not stop in time" not in err


def test_a_command_stuck_after_sigterm_exits_once_the_grace_is_over() -> None:
    code, took, err = _run_until_sigterm("stuck")
    assert code == 1, err
    assert 1.0 <= took < 3.0, took
    assert "did not stop in time" in err


def test_a_second_sigterm_while_stopping_does_not_kill_the_clean_up() -> None:
    # kubelet, a user's second Ctrl-C or `kill` twice: the second signal lands while the command closes
    # its servers after the signals' block. It used to find the default action restored and end the
    # process by the signal (-15), its clean-up and last log lines lost; the grace timer still bounds it.
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, "cleanup"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None
    err = proc.stderr.read()
    assert code == 0, err
    assert proc.stdout.read() == "cleaned up\n"
    assert "already stopping" in err and "did not stop in time" not in err
