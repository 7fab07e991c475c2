"""`nodefabric pick`: choose the best-connected set of free GPUs from a link matrix, and say why.

FILE is `nvidia-smi topo -m` output, or JSON: a Devices object (`kubectl get devices NODE -o json`), one
of its groups, `{"0": {"1": "NV18", ...}, ...}`, or a list of rows with "X" on the diagonal.
The first line printed is the chosen indices, comma-joined (CUDA_VISIBLE_DEVICES form); the second
says whether the search proved the set best (exact) or spent its budget first (best found). A matrix
of more than `pick.MAX_DEVICES` devices is refused, as is an index past `numbers.DEVICE_INDEX` (4095), one
device listed twice, and a JSON object that names one key twice.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from typing import Any

from pydantic import ValidationError

from nodefabric_devicemanager import numbers, yamldoc
from nodefabric_devicemanager import pick as picking
from nodefabric_devicemanager.accelerators import topo
from nodefabric_devicemanager.accelerators.links import group_matrix
from nodefabric_devicemanager.commands import document, infile, output
from nodefabric_devicemanager.models import AcceleratorGroup

Matrix = dict[int, dict[int, str]]

# The largest device index pick takes, from a file or --free: one bound for both.
MAX_INDEX = numbers.DEVICE_INDEX.hi
# NV<n> as link_rank reads it: "NV04" is "NV4".
_NV = re.compile(r"NV([0-9]{1,3})", re.ASCII)


class InputError(ValueError):
    pass


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--links",
        required=True,
        metavar="FILE",
        help="link matrix: JSON or `nvidia-smi topo -m` text; - for stdin",
    )
    parser.add_argument(
        "--free", metavar="LIST", help="free device indices, e.g. 1,2,3 or 0-3,6 (default: every device)"
    )
    parser.add_argument("--count", type=count, required=True, metavar="N", help="how many devices to choose")
    parser.add_argument(
        "--group",
        metavar="ID",
        help="which group of a Devices object (e.g. nvidia); needed when it has several",
    )
    output.add_output(parser, default="table")
    parser.add_argument(
        "--json",
        dest="output",
        action="store_const",
        const="json",
        help="the same as -o json: the choice and the reasons as one JSON object",
    )


def count(text: str) -> int:
    """`--count`: plain ASCII decimal, as every number nodefabric reads (int() would also take "٣",
    "1_0" and " 3 "). Below 1 is left for run to refuse with its own message."""
    digits = text[1:] if text.startswith("-") else text
    shown = text if len(text) <= 32 else f"{text[:32]}... ({len(text)} characters)"
    if not (digits.isascii() and digits.isdigit()):
        raise argparse.ArgumentTypeError(f"{shown!r} is not a whole number (plain ASCII decimal digits)")
    if len(digits) > 9 and not text.startswith("-"):  # spares int() a quadratic conversion
        raise argparse.ArgumentTypeError(
            f"{shown!r} is more devices than pick chooses among (at most {picking.MAX_DEVICES})"
        )
    return int(text) if len(digits) <= 9 else -1


def _index(text: str, where: str) -> int:
    if text.startswith("-"):
        raise InputError(f"{where}: device indices are never negative")
    try:
        value = numbers.parse(text, numbers.DEVICE_INDEX)
    except numbers.BadNumber as exc:
        raise InputError(f"{where}: {exc}") from exc
    assert value is not None  # DEVICE_INDEX has no "unknown" spelling
    return value


def parse_indices(text: str) -> list[int]:
    """ "1,2,3" or "0-3,6" -> [0, 1, 2, 3, 6]."""
    out: set[int] = set()
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if sep and not lo:
            raise InputError("--free: device indices are never negative")
        where = f"--free: {part!r} is not an index or a range (use 1,2,3 or 0-3)"
        if sep:
            first, last = _index(lo.strip(), where), _index(hi.strip(), where)
            if last < first:
                raise InputError(f"--free: range {part!r} runs backwards")
            out.update(range(first, last + 1))
        else:
            out.add(_index(part, where))
    return sorted(out)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's object_pairs_hook: a key named twice is refused (json keeps the last, silently)."""
    twice = [k for k, n in Counter(k for k, _ in pairs).items() if n > 1]
    if twice:
        raise InputError(f"not valid JSON for pick: the key {twice[0]!r} appears twice in one object")
    return dict(pairs)


def _json_int(text: str) -> int:
    try:
        return numbers.json_int(text)
    except ValueError as exc:
        raise InputError(f"not valid JSON for pick: {exc}") from None


def _group(raw: Any, where: str) -> AcceleratorGroup:
    """One group, its accelerators' indices held to what pick takes: a JSON integer (pydantic would
    also take "0", 1.0 and true), at most MAX_INDEX, each once."""
    accelerators = raw.get("accelerators") if isinstance(raw, dict) else None
    seen: dict[int, int] = {}
    for k, acc in enumerate(accelerators if isinstance(accelerators, list) else []):
        index = acc.get("index") if isinstance(acc, dict) else None
        at = f"{where}.accelerators[{k}].index"
        if index is None:
            continue  # left for the model to name as missing
        if isinstance(index, bool) or not isinstance(index, int):
            raise InputError(f"{at} is {type(index).__name__} {index!r:.40}, not a whole number")
        if not 0 <= index <= MAX_INDEX:
            raise InputError(f"{at} is {index}: device indices are 0..{MAX_INDEX}")
        if index in seen:
            raise InputError(f"{at}: device index {index} is listed twice (also accelerators[{seen[index]}])")
        seen[index] = k
    try:
        return AcceleratorGroup.model_validate(raw)
    except ValidationError as exc:
        raise InputError(document.model_error(exc, where)) from None


def _from_json(doc: Any, group_id: str | None) -> Matrix:
    if isinstance(doc, dict) and isinstance(doc.get("spec"), dict):
        listed = doc["spec"].get("groups") or []
        if not isinstance(listed, list):
            raise InputError(f"the Devices object's spec.groups is {type(listed).__name__}, not a list")
        groups = [_group(g, f"spec.groups[{k}]") for k, g in enumerate(listed)]
        if group_id is not None:
            at = [k for k, g in enumerate(groups) if g.id == group_id]
            if not at:
                raise InputError(f"no group {group_id!r} in the Devices object (groups: {_ids(groups)})")
            if len(at) > 1:
                # Either group's links would be a guess.
                raise InputError(
                    f"the Devices object has {len(at)} groups {group_id!r} "
                    f"(spec.groups[{at[0]}] and [{at[1]}]): --group cannot choose"
                )
            chosen = [groups[at[0]]]
        else:
            chosen = [g for g in groups if g.accelerators]
            if len(chosen) > 1:
                raise InputError(f"the Devices object has several groups {_ids(chosen)}: pass --group")
            if not chosen:
                raise InputError("the Devices object lists no accelerators")
        return group_matrix(chosen[0])
    if group_id is not None:
        raise InputError("--group chooses a group of a Devices object; this file is not one")
    if isinstance(doc, dict) and "accelerators" in doc:
        return group_matrix(_group(doc, "the group"))
    if isinstance(doc, dict):
        shape = "a JSON link matrix maps device index -> peer index -> link name"
        matrix: Matrix = {}
        for k, row in doc.items():
            if not isinstance(row, dict | None):
                raise InputError(f"{shape}; device {k!r} maps to {type(row).__name__}")
            i = _index(k, shape)
            cells = {_index(p, shape): v for p, v in (row or {}).items()}
            own = cells.pop(i, None)
            if own not in ("X", None):  # as in the list form: a number here was never read as a link
                raise InputError(f"device {i}: its own cell is {own!r:.40}, expected X (or null)")
            matrix[i] = {j: _link(v, i, j) for j, v in cells.items()}
        return matrix
    if isinstance(doc, list):
        if len(doc) > picking.MAX_DEVICES:
            raise InputError(_too_many(len(doc)))
        rows: Matrix = {}
        for i, row in enumerate(doc):
            if not isinstance(row, list) or len(row) != len(doc):
                raise InputError(f"row {i} of the JSON matrix is not a list of {len(doc)} cells")
            if row[i] not in ("X", None):
                raise InputError(f"row {i} of the JSON matrix: its own cell is {row[i]!r:.40}, expected X")
            rows[i] = {j: _link(cell, i, j) for j, cell in enumerate(row) if j != i}
        return rows
    raise InputError("the JSON is neither a Devices object, a group, a matrix nor a list of rows")


def _ids(groups: list[AcceleratorGroup]) -> str:
    """The groups' ids as a message lists them: the first 8, and how many in all past that."""
    shown = str([g.id[:40] for g in groups[:8]])
    return shown if len(groups) <= 8 else f"{shown[:-1]}, ...] ({len(groups):,} in all)"


def _same_link(a: str, b: str) -> bool:
    """Whether two known link names are one link: case aside ("nv4", "NV4"), and NV<n>'s n as a number
    ("NV04", "NV4"), as link_rank reads them."""
    a, b = a.upper(), b.upper()
    if a == b:
        return True
    na, nb = _NV.fullmatch(a), _NV.fullmatch(b)
    return na is not None and nb is not None and int(na[1]) == int(nb[1])


def _link(value: Any, i: int, j: int) -> str:
    if not isinstance(value, str):  # str() made 5 and null read as the names '5' and 'None'
        shown = "null" if value is None else f"{type(value).__name__} {value!r:.40}"
        raise InputError(f"link {i}-{j} is {shown}, not a link name (NV<n> LINK PIX PXB PHB NODE SYS UNK)")
    return value


def load_matrix(text: str, group_id: str | None = None) -> Matrix:
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            doc = json.loads(text, object_pairs_hook=_unique_keys, parse_int=_json_int)
        except json.JSONDecodeError as exc:
            raise InputError(f"not valid JSON: {exc}") from exc
        except RecursionError:  # nesting past the decoder's depth
            raise InputError(f"not valid JSON: {yamldoc.NESTED_TOO_DEEP}") from None
        matrix = _from_json(doc, group_id)
    else:
        if group_id is not None:
            raise InputError("--group chooses a group of a Devices object; this file is not one")
        try:
            matrix = topo.parse(text, max_gpus=picking.MAX_DEVICES).links
        except topo.TooManyGpus as exc:
            raise InputError(_too_many(exc.gpus)) from None
        except topo.TopoParseError as exc:
            raise InputError(f"not nvidia-smi topo -m output: {exc}") from exc
    indices = set(matrix) | {p for row in matrix.values() for p in row}
    if len(indices) > picking.MAX_DEVICES:
        raise InputError(_too_many(len(indices)))
    if max(indices, default=0) > MAX_INDEX:
        raise InputError(f"device index {max(indices)}: outside 0..{MAX_INDEX}")
    for i, row in matrix.items():
        for j, link in row.items():
            if not picking.known_link(link):
                raise InputError(f"link {i}-{j} is {link!r}, not one of NV<n> LINK PIX PXB PHB NODE SYS UNK")
            back = matrix.get(j, {}).get(i)
            if back is not None and not _same_link(back, link):
                # One link read two ways: the pick would follow whichever direction it looked up.
                raise InputError(f"link {i}-{j} is {link} but link {j}-{i} is {back}: one link, two names")
    return matrix


def _too_many(devices: int) -> str:
    return (
        f"the link matrix has {devices} devices; pick chooses among at most {picking.MAX_DEVICES} "
        "(the search's time bound holds up to there)"
    )


def _slowest_name(matrix: Matrix, chosen: list[int]) -> str:
    rank = picking.matrix_rank(matrix)
    pairs = [(rank(a, b), a, b) for i, a in enumerate(chosen) for b in chosen[i + 1 :]]
    if not pairs:
        return ""
    _, a, b = min(pairs)
    return matrix.get(a, {}).get(b) or matrix.get(b, {}).get(a) or "UNK"


def explain(matrix: Matrix, free: list[int], count: int) -> dict[str, Any]:
    picked = picking.choose(matrix, free, count)
    chosen = picked.indices
    base = picking.lowest(free, count)
    rank = picking.matrix_rank(matrix)
    mine, theirs = picking.score(chosen, rank), picking.score(base, rank)
    return {
        "chosen": chosen,
        # exact: no set beats it; best-found: the search spent its step budget before it could say so.
        "search": "exact" if picked.exact else "best-found",
        "slowestLink": _slowest_name(matrix, chosen),
        "totalRank": mine.total,
        "lowestFree": base,
        "lowestFreeSlowestLink": _slowest_name(matrix, base),
        "lowestFreeTotalRank": theirs.total,
    }


def run(args: argparse.Namespace) -> int:
    try:
        try:
            text = infile.read_text(args.links)
        except infile.BadInput as exc:
            raise InputError(f"cannot read {args.links}: {exc}") from None
        matrix = load_matrix(text, args.group)
        known = sorted(set(matrix) | {p for row in matrix.values() for p in row})
        free = parse_indices(args.free) if args.free is not None else known
        missing = [i for i in free if i not in matrix] if matrix else []
        if missing:
            shown = ",".join(map(str, missing[:8])) + (
                f",... ({len(missing)} in all)" if len(missing) > 8 else ""
            )
            rows = sorted(matrix)
            if args.free is None:  # named as a peer, never given a row: "--free names" would blame no flag
                raise InputError(
                    f"the link matrix names device(s) {shown} only as a peer, with no row of its own "
                    f"(rows: {rows})"
                )
            raise InputError(f"--free names device(s) {shown} the link matrix does not have (rows: {rows})")
        if args.count < 1:
            raise InputError("--count must be at least 1")
        if args.count > len(free):
            raise InputError(f"--count {args.count} is more than the {len(free)} free device(s)")
        result = explain(matrix, free, args.count)
    except (OSError, ValueError, RecursionError) as exc:
        # ValueError also covers a malformed Devices object (pydantic), a file that is not UTF-8 text and
        # a matrix naming a negative index; RecursionError a JSON nested deeper than the parser goes:
        # each is bad input that gets its message, never a traceback.
        print(output.one_line(f"nodefabric pick: {exc}"), file=sys.stderr)
        return 2
    if args.output != "table":
        output.document(result, args.output, sys.stdout)
        return 0
    print(",".join(str(i) for i in result["chosen"]))
    if args.count > 1:
        how = (
            "exact"
            if result["search"] == "exact"
            else "best found: the search spent its budget before proving no set beats it"
        )
        print(f"slowest link {result['slowestLink']}, total link rank {result['totalRank']} ({how})")
        if result["lowestFree"] != result["chosen"]:
            print(
                f"lowest free {','.join(map(str, result['lowestFree']))} would have slowest link "
                f"{result['lowestFreeSlowestLink']}, total link rank {result['lowestFreeTotalRank']}"
            )
        else:
            print("the lowest free indices are already the best-connected set")
    return 0
