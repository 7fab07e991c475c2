"""`nodefabric labels -f devices.json|yaml [--domain D] [-o text|table|json|yaml]`: print the node
labels a Devices record yields.

The same pure function the operator runs, so an operator can ask "what would this node be labelled?"
from `kubectl get devices <node> -o yaml` without a cluster write. Withheld values go to stderr.
`-o text` (the default) prints `key=value` lines, as `kubectl label` takes them; `table` two columns.
"""

from __future__ import annotations

import argparse
import sys

import pydantic
import yaml

from nodefabric_devicemanager.commands import document, output
from nodefabric_operator import labels


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f", "--filename", required=True, help="a Devices object as JSON or YAML; - for stdin"
    )
    parser.add_argument("--domain", default=labels.DEFAULT_DOMAIN, help="label domain (default: %(default)s)")
    output.add_output(parser, default="text", extra=["text"])


def run(args: argparse.Namespace) -> int:
    try:
        domain = labels.check_domain(args.domain)
    except labels.InvalidDomain as err:
        print(output.one_line(f"nodefabric labels: {err}"), file=sys.stderr)
        return 2
    try:
        devices = document.load_devices(args.filename)
    except (ValueError, RecursionError, yaml.YAMLError, pydantic.ValidationError) as err:
        # One line, whatever the parser's message looks like (pydantic's spans several).
        print(output.one_line(f"nodefabric labels: cannot read {args.filename}: {err}"), file=sys.stderr)
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
