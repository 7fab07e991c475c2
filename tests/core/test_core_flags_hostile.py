"""Every typed flag of every command, given hostile values, through the console's real parser: a value or
a usage error (exit 2, one line on stderr, control characters escaped, cut short), never a traceback out
of a flag's type function (an OverflowError, say, which argparse does not turn into a usage error)."""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Iterator

import pytest

from nodefabric_operator.console import COMMANDS, build_parser

HOSTILE = [
    "nan", "inf", "-inf", "1e400", "-1e400", "1e-400", "-1", "-0", "0", "9" * 30, "9" * 5000, "", " 3 ",
    "1_0", "0x10", "\u0663", "true", "a,b,,c", "\x1b[2J", "a\nb", "/dev/zero", "/nonexistent", "x" * 5000,
]  # fmt: skip


def _typed(parser: argparse.ArgumentParser, path: list[str]) -> Iterator[tuple[list[str], str]]:
    """(subcommand path, flag) for every flag that takes a value through a type function."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _typed(sub, [*path, name])
        elif action.option_strings and action.nargs != 0 and action.type is not None:
            yield path, action.option_strings[-1]


def _flags() -> list[tuple[list[str], str]]:
    found = []
    for command in COMMANDS:
        parser, _ = build_parser([command])
        (subs,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        found.extend(_typed(subs.choices[command], [command]))
    return found


FLAGS = _flags()


def test_the_sweep_reaches_every_commands_typed_flags() -> None:
    """The sweep below is not vacuous: it finds the typed flags of the long-running commands."""
    named = {(path[0], flag) for path, flag in FLAGS}
    assert {("agent", "--interval"), ("extender", "--port"), ("deviceplugin", "--shared-count")} <= named
    assert len(FLAGS) >= 40


@pytest.mark.parametrize(("path", "flag"), FLAGS, ids=[" ".join([*p, f]) for p, f in FLAGS])
def test_a_hostile_value_is_a_value_or_one_line_usage_error(path: list[str], flag: str) -> None:
    # "--flag=-inf" as well as "--flag -inf": argparse takes a separate "-inf" (not a negative number
    # to it) for an option and says "expected one argument" without calling the type function.
    for argv in [argv for value in HOSTILE for argv in ([*path, flag, value], [*path, f"{flag}={value}"])]:
        err = io.StringIO()
        parser, _ = build_parser(argv)
        with contextlib.redirect_stderr(err):
            try:
                parser.parse_args(argv)
            except SystemExit as exit_:
                said = err.getvalue()
                assert exit_.code == 2, (argv, said)
                assert said.count("\n") == 1 and said.endswith("\n"), (argv, said)
                assert "\x1b" not in said and len(said) < 2200, (argv, said[:300])
