"""The operator's metrics and health flags: a bad idle timeout or address is one line at start. The
server behind them (slow and hostile clients, the address bound, a busy port) is the shared one:
tests/core/test_core_shell_server.py."""

from __future__ import annotations

import argparse
import logging

import pytest

from nodefabric_operator import cli


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "1e9", "x", ""])
def test_a_bad_idle_timeout_is_refused_by_the_parser(bad, capsys):
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["--idle-timeout", bad])
    assert exc.value.code == 2 and "--idle-timeout" in capsys.readouterr().err


def test_the_flags_reach_the_options():
    opts = cli.options(_parse("--bind-address", "127.0.0.1", "--idle-timeout", "2.5"))
    assert (opts.bind_address, opts.idle_timeout) == ("127.0.0.1", 2.5)
    defaults = cli.options(_parse())
    assert (defaults.bind_address, defaults.idle_timeout) == ("0.0.0.0", 10.0)


def test_an_empty_address_is_refused_at_start(caplog):
    with caplog.at_level(logging.ERROR):
        assert cli.run(_parse("--bind-address", " ")) == 2
    assert "--bind-address is empty" in caplog.records[-1].error
