"""`nodefabric labels -f devices.json|yaml [--domain D] [-o text|table|json|yaml]`: print the node
labels a Devices record yields.

The same pure function the operator runs, so an operator can ask "what would this node be labelled?"
from `kubectl get devices <node> -o yaml` without a cluster write. Withheld values go to stderr.
`-o text` (the default) prints `key=value` lines, as `kubectl label` takes them; `table` two columns.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import pydantic
import yaml

from nodefabric_devicemanager.commands import output
from nodefabric_devicemanager.models import Devices
from nodefabric_operator import labels


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f", "--filename", required=True, help="a Devices object as JSON or YAML; - for stdin"
    )
    parser.add_argument("--domain", default=labels.DEFAULT_DOMAIN, help="label domain (default: %(default)s)")
    output.add_output(parser, default="text", extra=["text"])


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8") as f:
        return f.read()


MAX_NODES = 2_000_000  # values in a document once YAML aliases are expanded; a 3 MiB record has ~300k


def expanded_size(doc: Any, limit: int = MAX_NODES) -> int:
    """How many values `doc` holds with every YAML alias expanded, refused beyond `limit`. The loader
    shares an aliased value instead of copying it, so a 1 KB file of nested aliases (a "billion
    laughs") loads at once and then hangs whatever walks it: validation, here for ever."""
    count, stack = 0, [doc]
    while stack:
        node = stack.pop()
        count += 1
        if count > limit:
            raise ValueError(f"the document expands to more than {limit:,} values (YAML aliases)")
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return count


def load(text: str) -> Devices:
    """A Devices object from JSON or YAML text (YAML is a superset of JSON)."""
    doc: Any = yaml.safe_load(text)
    expanded_size(doc)
    if not isinstance(doc, dict):
        raise ValueError("expected one Devices object (a mapping), got " + type(doc).__name__)
    if doc.get("kind") not in (None, "Devices"):
        raise ValueError(f"expected kind Devices, got {doc.get('kind')!r}")
    return Devices.from_wire(doc)


def run(args: argparse.Namespace) -> int:
    try:
        domain = labels.check_domain(args.domain)
    except labels.InvalidDomain as err:
        print(f"nodefabric labels: {err}", file=sys.stderr)
        return 2
    try:
        devices = load(_read(args.filename))
    except (OSError, ValueError, RecursionError, yaml.YAMLError, pydantic.ValidationError) as err:
        # One line, whatever the parser's message looks like (pydantic's spans several).
        print(
            output.escape(f"nodefabric labels: cannot read {args.filename}: {' '.join(str(err).split())}"),
            file=sys.stderr,
        )
        return 2
    result = labels.compute(devices, domain)
    ordered = dict(sorted(result.labels.items()))
    if args.output in ("json", "yaml"):
        output.document(ordered, args.output, sys.stdout)
    elif args.output == "table":
        output.table([["LABEL", "VALUE"], *ordered.items()], sys.stdout)
    else:
        for k, v in ordered.items():
            print(output.escape(f"{k}={v}"))
    for w in result.withheld:
        print(output.escape(f"withheld {w.key}={w.value}: {w.reason}"), file=sys.stderr)
    return 0
