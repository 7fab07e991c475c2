"""The `nodefabric` console script: one subcommand per job, each in the module that owns it.

Subcommand modules are imported only when chosen, so `nodefabric inventory` on a node never pays for
kopf or grpc. Each module exposes `add_arguments(parser)` and `run(args) -> int`.

`--log-format` and `--log-level` are accepted before or after the subcommand (a Helm chart appends them
to a component's own arguments). A usage error is one line on stderr and exit 2, never a traceback.
"""

# ruff: noqa: E402  (the imports below come after the Ctrl-C handler their own import time needs)
from __future__ import annotations

import signal


def _interrupted(signum: int, frame: object) -> None:
    raise SystemExit(130)  # a quiet exit, with the shell's own code for SIGINT


# Ctrl-C while this module's own imports run (tens of ms of start-up, before main can catch it) is a
# quiet exit 130, not a KeyboardInterrupt traceback through the import machinery. The handler before it
# (Python's, raising KeyboardInterrupt) is back once the imports are done.
try:
    _before_imports, _quieted = signal.signal(signal.SIGINT, _interrupted), True
except ValueError:  # imported from a thread other than the main one: signals are not its to set
    _before_imports, _quieted = signal.SIG_DFL, False

import argparse
import errno
import gc
import importlib
import os
import re
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, Protocol

from nodefabric_devicemanager import logs
from nodefabric_operator import stdout

if _quieted:
    # None: a handler set from C, which Python cannot put back; its own default is the nearest.
    signal.signal(signal.SIGINT, _before_imports or signal.default_int_handler)


class Command(Protocol):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


# One function per subcommand, each importing its module by name so the import contracts (and a reader)
# see what the console depends on; the import runs only when that command is chosen. A module is a
# Command by duck typing (it has add_arguments and run), which mypy checks through the Protocol.


def _inventory() -> Command:
    from nodefabric_devicemanager.commands import inventory

    return inventory


def _preflight() -> Command:
    from nodefabric_devicemanager.commands import preflight

    return preflight


def _pick() -> Command:
    from nodefabric_devicemanager.commands import pick

    return pick


def _agent() -> Command:
    from nodefabric_devicemanager.agent import cli

    return cli


def _deviceplugin() -> Command:
    from nodefabric_deviceplugin import cli

    return cli


def _draplugin() -> Command:
    from nodefabric_deviceplugin.dra import cli

    return cli


def _slices() -> Command:
    from nodefabric_deviceplugin.dra import slices_cli

    return slices_cli


def _labels() -> Command:
    from nodefabric_operator import labels_cli

    return labels_cli


def _operator() -> Command:
    from nodefabric_operator import cli

    return cli


def _extender() -> Command:
    from nodefabric_operator.extender import cli

    return cli


def _placement() -> Command:
    from nodefabric_operator.admission import cli

    return cli


def _crd() -> Command:
    from nodefabric_operator import crd_apply

    return crd_apply


def _demo() -> Command:
    from nodefabric_operator.demo import main

    return main


# name -> (loader, one-line help)
COMMANDS: dict[str, tuple[Callable[[], Command], str]] = {
    "inventory": (_inventory, "read this host and print its Devices record"),
    "preflight": (_preflight, "one verdict per RDMA endpoint of this host"),
    "pick": (_pick, "choose the best-connected set of free GPUs"),
    "agent": (_agent, "publish this node's Devices record (DaemonSet)"),
    "deviceplugin": (_deviceplugin, "serve the RDMA device-plugin resources to kubelet"),
    "draplugin": (_draplugin, "serve RDMA endpoints as a DRA driver"),
    "slices": (_slices, "print the ResourceSlices this host would publish"),
    "labels": (_labels, "print the node labels a Devices record yields"),
    "operator": (_operator, "publish node labels from Devices objects (kopf)"),
    "extender": (_extender, "serve the kube-scheduler extender"),
    "placement": (_placement, "admit whole groups by scheduling gates (PlacementGroups; leader-elected)"),
    "crd": (_crd, "apply (or print) this version's Devices CRD: the upgrade hook"),
    "demo": (_demo, "run the whole product on an embedded default"),
}

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _columns() -> int:
    """The terminal's width as shutil.get_terminal_size() gives it: $COLUMNS, else the terminal's own,
    else 80."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class Formatter(argparse.HelpFormatter):
    """argparse's help formatter, given the width it would pick itself. Left to find it, it imports
    shutil (with bz2, lzma and zlib: ~3 ms) in every parser and option made, so every command paid for
    help it did not print."""

    def __init__(
        self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None
    ) -> None:
        super().__init__(
            prog, indent_increment, max_help_position, _columns() - 2 if width is None else width
        )


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line on stderr (and exit 2) instead of the usage block."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", Formatter)  # subparsers too: they are made as this class
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        # argparse quotes a bad choice with repr, but an unrecognized argument as typed: escaped here, so
        # an argument can never move the cursor or forge a line of the message.
        from nodefabric_devicemanager.commands.output import one_line

        self.exit(2, f"{one_line(f'{self.prog}: error: {message} (see {self.prog} --help)')}\n")


def log_level(text: str) -> str:
    """A level in any case ("debug", "DEBUG"), as logging spells it ("DEBUG")."""
    level = text.strip().lower()
    if level == "warn":
        level = "warning"
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a log level (one of {', '.join(LOG_LEVELS)})")
    return level.upper()


def version() -> str:
    import importlib.metadata  # here, not at the top: every command's start-up paid for it

    try:
        return importlib.metadata.version("nodefabric")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"  # run from a source tree that was never installed


class _Version(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> NoReturn:
        sys.stdout.write(f"nodefabric {version()}\n")  # where argparse's own version action writes it
        parser.exit(0)


def _log_options(parser: argparse.ArgumentParser, *, default: bool) -> None:
    # After the subcommand the defaults are SUPPRESS, so an option given before it is not overwritten.
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text" if default else argparse.SUPPRESS,
        help="text (key=value) or json, one line per event (default: text)",
    )
    parser.add_argument(
        "--log-level",
        type=log_level,
        default="INFO" if default else argparse.SUPPRESS,
        metavar="LEVEL",
        help=f"{', '.join(LOG_LEVELS)} (default: info)",
    )


def _extra_providing(package: str) -> str | None:
    """The optional extra of nodefabric (`pip install 'nodefabric[EXTRA]'`) that brings `package`."""

    def norm(text: str) -> str:
        return re.sub(r"[-_.]+", "-", text).lower()

    import importlib.metadata  # here, not at the top: every command's start-up paid for it

    try:
        requirements = importlib.metadata.requires("nodefabric") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for requirement in requirements:
        named = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
        extra = re.search(r"extra\s*==\s*[\"']([^\"']+)[\"']", requirement)
        if named and extra and norm(named.group()) == norm(package):
            return extra.group(1)
    return None


def _load(name: str, loader: Callable[[], Command]) -> Command:
    """A subcommand's module. A third-party package it needs that is not installed (the image carries no
    extras, so `demo` finds no kmock there) is one line and exit 2, not an ImportError traceback."""
    try:
        return loader()
    except ModuleNotFoundError as exc:
        package = (exc.name or "").split(".")[0]
        if not package or package.startswith("nodefabric_"):
            raise  # our own module missing is a broken install or a bug, not a user's error
        extra = _extra_providing(package)
        remedy = (
            f"pip install 'nodefabric[{extra}]'" if extra else "reinstall nodefabric with its dependencies"
        )
        sys.stderr.write(
            f"nodefabric {name} needs the Python package {package}, which is not installed here: {remedy}\n"
        )
        raise SystemExit(2) from None


def _help_before(argv: Sequence[str], command: str) -> bool:
    """-h/--help given before the subcommand: the top-level help, which lists every command."""
    before = argv[: list(argv).index(command)]
    return any(a in ("-h", "--help") or (a.startswith("--h") and "--help".startswith(a)) for a in before)


def build_parser(argv: Sequence[str]) -> tuple[argparse.ArgumentParser, Command | None]:
    parser = Parser(prog="nodefabric", description="Kubernetes device manager for GPU clusters")
    # The version is looked up only when asked for: reading the installed metadata costs every command
    # (`nodefabric inventory` on each uevent) tens of milliseconds of start-up.
    parser.add_argument("--version", action=_Version, nargs=0, help="show the version and exit")
    _log_options(parser, default=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = next((a for a in argv if a in COMMANDS), None)
    # A command run builds its own subparser only (the other twelve cost every command a few ms of
    # start-up); help asked before it (`nodefabric --help inventory`) and a missing or unknown command
    # (whose error lists them) build every one.
    listed = COMMANDS
    if chosen is not None and not _help_before(argv, chosen):
        listed = {chosen: COMMANDS[chosen]}
    command: Command | None = None
    for name, (loader, help_) in listed.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name == chosen:
            command = _load(name, loader)
            command.add_arguments(p)
            _log_options(p, default=False)
    return parser, command


# pydantic's plugin loader, and the values of PYDANTIC_DISABLE_PLUGINS with which it loads none.
_PLUGIN_LOADER = "pydantic.plugin._loader"
_NO_PLUGINS = ("__all__", "1", "true")


def skip_pydantic_plugins(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Load no pydantic plugin in this process, unless PYDANTIC_DISABLE_PLUGINS says which to skip.

    We ship none, and looking costs every command tens of milliseconds: pydantic's loader imports
    importlib.metadata (email, zipfile, csv, ...: ~20 ms) and reads the entry points of every installed
    distribution at the first model build. The variable unset (or set to skip all) puts a loader that
    finds none where pydantic's own would be imported; set to names (or empty), pydantic's own loader
    runs as it documents. The stand-in answers get_plugins() only; any other name pydantic asks of it
    (a later release) loads the real loader, so a change there costs time, not a failure.
    Returns whether the stand-in is in place."""
    if environ.get("PYDANTIC_DISABLE_PLUGINS", "__all__") not in _NO_PLUGINS or _PLUGIN_LOADER in sys.modules:
        return False
    stand_in = types.ModuleType(_PLUGIN_LOADER, "No pydantic plugins: see nodefabric_operator.console.")

    def get_plugins() -> tuple[()]:
        return ()

    def real(name: str) -> Any:
        if name.startswith("__"):  # the import system asking what kind of module this is
            raise AttributeError(name)
        if sys.modules.get(_PLUGIN_LOADER) is stand_in:
            del sys.modules[_PLUGIN_LOADER]
        return getattr(importlib.import_module(_PLUGIN_LOADER), name)

    stand_in.get_plugins = get_plugins  # type: ignore[attr-defined]
    stand_in.__getattr__ = real  # type: ignore[method-assign]
    sys.modules[_PLUGIN_LOADER] = stand_in
    return True


def _settle_heap() -> None:
    """After the imports: collect once and freeze what is left.

    A command's imports leave tens of thousands of container objects that live as long as the process
    (modules, classes, pydantic's schemas and validators); with the collector on, collections during the
    imports and the walk traversed them again and again: 5% of `nodefabric inventory`'s instructions.
    Collected once (under a thousand objects of garbage) and frozen, they are no longer traversed; what
    the command makes is collected as before."""
    gc.collect()
    gc.freeze()


def main(argv: Sequence[str] | None = None) -> int:
    # Called as the process itself (the console script, `python -m`): not from a longer-lived caller (a
    # test), whose heap is not ours to freeze.
    entry = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    skip_pydantic_plugins()
    if entry:
        gc.disable()  # until _settle_heap: no collection traverses the imports while they are made
    # Messages, logs included, that cannot be written are dropped (see stdout.Diagnostics): the exit code
    # is still the command's.
    real_err = sys.stderr
    sys.stderr = diagnostics = stdout.Diagnostics(real_err)  # type: ignore[assignment]
    try:
        # The command's module is imported here (seconds on a loaded machine): Ctrl-C may land in it.
        try:
            parser, command = build_parser(argv)
            if entry:
                _settle_heap()
        finally:
            if entry:
                gc.enable()
        return _run(lambda: _parse_and_run(parser, command, argv))
    except KeyboardInterrupt:
        return 130  # Ctrl-C: the shell's own code for SIGINT, without a traceback
    finally:
        sys.stderr = real_err
        diagnostics.settle()


def _parse_and_run(parser: argparse.ArgumentParser, command: Command | None, argv: list[str]) -> int:
    args = parser.parse_args(argv)  # --version and --help print here, through _run's stdout
    logs.configure(json_output=args.log_format == "json", level=args.log_level)
    assert command is not None  # argparse already refused an unknown or missing command
    return command.run(args)


def _run(body: Callable[[], int]) -> int:
    """The command, with its output's failures as one line (see stdout), never a traceback."""
    real = sys.stdout
    sys.stdout = output = stdout.Output(real)  # type: ignore[assignment]
    try:
        try:
            code = body()
        except SystemExit:
            # --help and --version print inside argparse, which ignores a write that fails.
            if output.failure is not None:
                raise output.failure from None
            if output.wrote:  # what they printed is heard now, not at interpreter exit
                output.flush()
            raise
        output.flush()  # a write that fails is heard here, not at interpreter exit
        return code
    except stdout.OutputFailed as err:
        if real is not None:
            # What is still buffered goes nowhere, rather than failing again at interpreter exit.
            stdout.discard(real)
        if err.errno == errno.EPIPE:
            # The reader stopped early (`nodefabric inventory | head`): a filter's quiet end, with the
            # code a shell shows for a process SIGPIPE ended (Python ignores the signal, raising this).
            return 128 + signal.SIGPIPE
        print(f"nodefabric: cannot write the output: {err.strerror}", file=sys.stderr)
        return 1
    finally:
        sys.stdout = real


if __name__ == "__main__":
    sys.exit(main())
