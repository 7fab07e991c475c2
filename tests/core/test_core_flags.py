"""The flag values every command shares (ports, seconds): one parser, so every command refuses the same
bad value the same way, through each command's real argparse parser: one line naming the flag, exit 2."""

from __future__ import annotations

import pytest

from nodefabric_operator import console

# (command, flag, lowest accepted) for every TCP port flag of every command.
PORTS = [
    ("agent", "--metrics-port", 0),
    ("agent", "--health-port", 0),
    ("deviceplugin", "--metrics-port", 0),
    ("draplugin", "--metrics-port", 0),
    ("operator", "--metrics-port", 1),  # absent is off, so 0 means nothing
    ("operator", "--health-port", 1),
    ("extender", "--port", 0),
    ("extender", "--metrics-port", 0),
]
# (command, flag) for every flag that counts something (the command checks its own bounds afterwards).
COUNTS = [
    ("agent", "--shared-count"),
    ("deviceplugin", "--shared-count"),
    ("extender", "--max-request-bytes"),
    ("extender", "--max-in-flight-bytes"),
]
# (command, flag, whether 0 is accepted, the most accepted or None) for every flag in seconds.
SECONDS = [
    ("agent", "--interval", False, 604800),
    ("agent", "--walk-interval", False, 604800),
    ("agent", "--read-timeout", False, 604800),
    ("agent", "--debounce", False, 604800),
    ("deviceplugin", "--interval", False, None),
    ("draplugin", "--interval", False, 86400),
    ("draplugin", "--resync", False, 86400),
    ("operator", "--startup-timeout", True, 3600),
    ("extender", "--read-timeout", False, None),
    ("extender", "--unhealthy-after", False, None),
]
# What int() or float() would take and nobody means: signs, spaces, underscores, non-ASCII digits, hex.
NOT_NUMBERS = [
    "",
    " 80",
    "80 ",
    "80\n",
    "+80",
    "8_0",
    "\uff18\uff10",
    "\u0668\u0660",
    "0x50",
    "80.0",
    "eighty",
]
NOT_SECONDS = ["", " 5", "5 ", "5\n", "+5", "1_0", "\u0665", "0x10", "nan", "inf", "-inf", "five", "5s"]


def parse(capsys: pytest.CaptureFixture[str], command: str, flag: str, value: str) -> tuple[object, str]:
    """The value the command's parser gives the flag, or the one line it refuses it with (exit 2)."""
    argv = [command, f"{flag}={value}"]  # "=": a value starting with "-" is not taken for a flag
    parser, _ = console.build_parser(argv)
    try:
        return getattr(parser.parse_args(argv), flag[2:].replace("-", "_")), ""
    except SystemExit as exit_:
        assert exit_.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        return None, err


@pytest.mark.parametrize(("command", "flag", "lowest"), PORTS)
def test_every_port_flag_takes_a_port_and_nothing_else(capsys, command, flag, lowest):
    for good in {str(lowest), "80", "65535"}:
        assert parse(capsys, command, flag, good) == (int(good), "")
    for bad in [*NOT_NUMBERS, "-1", "65536", "99999999999999999999", *(["0"] if lowest else [])]:
        value, err = parse(capsys, command, flag, bad)
        assert value is None, (bad, value)
        assert f"argument {flag}: not a TCP port ({lowest}-65535): {bad!r}" in err, err


@pytest.mark.parametrize(("command", "flag"), COUNTS)
def test_every_count_flag_takes_a_whole_number_and_nothing_else(capsys, command, flag):
    for good in ["0", "1", "64", "999999999999999999"]:
        assert parse(capsys, command, flag, good) == (int(good), "")
    for bad in [*NOT_NUMBERS, "-1", "1e3", "9" * 19]:
        value, err = parse(capsys, command, flag, bad)
        assert value is None, (bad, value)
        assert f"argument {flag}: not a whole number (0 or more): {bad!r}" in err, err
    # 5,000 digits: refused the same way, the one line cut (commands.output.one_line), not echoed whole.
    value, err = parse(capsys, command, flag, "9" * 5000)
    assert value is None
    assert f"argument {flag}: not a whole number (0 or more): '9999" in err, err
    assert err.endswith(" characters in all)\n") and len(err) < 2_100, err


@pytest.mark.parametrize(("command", "flag", "zero", "most"), SECONDS)
def test_every_seconds_flag_takes_a_finite_number_of_seconds_in_its_range(capsys, command, flag, zero, most):
    for good, value in [("0.5", 0.5), (".5", 0.5), ("2", 2.0), ("1e1", 10.0), ("3600", 3600.0)]:
        assert parse(capsys, command, flag, good) == (value, "")
    if most is not None:
        assert parse(capsys, command, flag, str(most)) == (most, "")
    for bad in NOT_SECONDS:
        value, err = parse(capsys, command, flag, bad)
        assert value is None and f"argument {flag}: not a number of seconds: {bad!r}" in err, (bad, err)
    out_of_range = ["-1", "-0.5", "1e999", *([] if zero else ["0", "0.0", "0e5"])]
    out_of_range += [] if most is None else [str(most + 1), f"{most}.5"]
    for bad in out_of_range:
        value, err = parse(capsys, command, flag, bad)
        assert value is None, (bad, value)
        if most is None:
            assert f"argument {flag}: must be a positive number of seconds, got {bad!r}" in err, err
        else:
            rule = f"between 0 and {most} seconds{'' if zero else ', not 0'}"
            assert f"argument {flag}: must be {rule}, got {bad!r}" in err, err
    if zero:
        for nothing in ["0", "-0", "0.0", "0e9"]:
            value, _ = parse(capsys, command, flag, nothing)
            assert value == 0.0 and str(value) == "0.0", (nothing, value)
