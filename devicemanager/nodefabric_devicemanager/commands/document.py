"""The Devices object a command is handed (`labels -f`, `slices -f`), loaded at a bounded cost.

PyYAML's loader builds a Python node for every value before anything can count them: 16 MiB of
`[1,1,1,...]` (inside infile's cap) took it four minutes and 5.7 GB. Counting the values first, from the
parser's event stream (libyaml's, when PyYAML has it: constant memory, about a second per million),
refuses such a file before the loader sees it. The budget is far above any record the API server can
hold (its 1.5 MiB object limit is about 150,000 values; a node with 1,024 VFs has 47,500). Aliases count
once here; what they expand to is yamldoc's check.
"""

from __future__ import annotations

import reprlib

import yaml
from pydantic import ValidationError

from nodefabric_devicemanager import yamldoc
from nodefabric_devicemanager.commands import infile
from nodefabric_devicemanager.models import Devices

MAX_NODES = 250_000

_Parser = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser, when PyYAML was built with it
_NODES = (yaml.ScalarEvent, yaml.AliasEvent, yaml.CollectionStartEvent)


def count_nodes(text: str, limit: int = MAX_NODES) -> int:
    """How many values (scalars, aliases, lists, mappings) the text holds, up to where it stops parsing;
    BadInput beyond `limit`. A text that does not parse is left to the loader to say so, in the words
    yamldoc gives every command (it stops at the same place, within the budget)."""
    count = 0
    try:
        for event in yaml.parse(text, Loader=_Parser):
            if isinstance(event, _NODES):
                count += 1
                if count > limit:
                    raise infile.BadInput(
                        f"it holds more than {limit:,} values "
                        "(a Devices record of 1,024 VFs holds about 50,000)"
                    )
    except yaml.YAMLError:
        pass
    return count


_SHOWN = reprlib.Repr()  # keyword arguments only from Python 3.12
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother = 2, 40, 40


def model_error(exc: ValidationError, where: str = "") -> str:
    """pydantic's report (a paragraph per error, and a URL) as one clause naming the first bad field and
    what it was (shown bounded: the input may be the whole 16 MiB document)."""
    first = exc.errors()[0]
    located = ".".join([where] * bool(where) + [str(p) for p in first["loc"]])
    count = exc.error_count()
    said = (
        f"{first['msg']}, got {_SHOWN.repr(first.get('input'))} ({count} validation error{'s' * (count > 1)})"
    )
    return f"{located}: {said}" if located else said


def load_devices(path: str) -> Devices:
    """The Devices object in the file ("-": standard input). BadInput, ValueError (a record the model
    refuses: its first bad field, in one clause) or yaml.YAMLError when there is none to load."""
    text = infile.read_text(path)
    count_nodes(text)
    try:
        return yamldoc.load_devices(text)
    except ValidationError as exc:
        raise ValueError(model_error(exc)) from None
